"""`fathom tune` on the GPU (issue 19), at Qwen3.5-397B-A17B's shapes: every candidate of every
op (dense and NVFP4 products, NVFP4 experts, attention, delta rule, sampling) passes its checks
on a healthy GPU and the first tuning takes under 60 s; the cache answers a second run under
2 s; with faults injected into each op's chosen candidate (NaN, an illegal address, wrong values
in turn) each is rejected with its failed check named, other verified candidates are chosen, and
the faulty runs keep a cache entry of their own. With an out-of-bounds write planted in each op's
chosen candidate (oob: 64 bytes just past its output, the output itself right), the checks' guard
zones reject it with the op and candidate named, and only it.

Run by ctest (label gpu, scripts/test_gpu.sh) as: python3 backend_tuning_gpu.py --fathom BIN --config CONFIG
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def tune(fathom, config, out, env, no_cache=True):
    cmd = [fathom, "tune", config, "--json-out", out] + (["--no-cache"] if no_cache else [])
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.load(open(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--config", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp)
        env.pop("FATHOM_BACKEND_FAULT", None)
        first = tune(a.fathom, a.config, tmp + "/a.json", env)
        assert first["tuned"], first
        failed = [c for c in first["checks"] if not c["passed"]]
        assert not failed, failed
        assert first["seconds"] < 60, first["seconds"]
        again = tune(a.fathom, a.config, tmp + "/b.json", env, no_cache=False)
        assert again["from_cache"] and again["seconds"] < 2, again
        assert again["choices"] == first["choices"]

        # Faults in each op's chosen candidate (the decode experts' first and second choice), the
        # kinds in turn (every op has a second implementation to fall back on).
        kinds = ["nan", "crash", "wrong"]
        bad = {}
        for op in dict.fromkeys(c["op"] for c in first["choices"]):
            cands = {c["candidate"] for c in first["checks"] if c["candidate"].startswith(op + "/")}
            if len(cands) < 2:
                continue
            chosen = [c["candidate"] for c in first["choices"] if c["op"] == op]
            bad[f"{op}/{chosen[0]}"] = kinds[len(bad) % 3]
            others = sorted({x for x in chosen} - {chosen[0]})
            if op == "moe.fp4.decode" and others:
                bad[f"{op}/{others[0]}"] = kinds[len(bad) % 3]
        env_f = dict(env, FATHOM_BACKEND_FAULT=",".join(f"{c.replace('/', ':')}:{k}" for c, k in bad.items()))
        faulty = tune(a.fathom, a.config, tmp + "/c.json", env_f)
        # NaN bytes in the sampler's output are token ids of -1.
        expect = {"nan": ("NaN/Inf", "outside the vocabulary"), "wrong": ("",), "crash": ("illegal memory access",)}
        for cand, kind in bad.items():
            checks = [c for c in faulty["checks"] if c["candidate"] == cand]
            assert checks and all(not c["passed"] for c in checks), (cand, checks)
            assert any(e in checks[0]["failure"] for e in expect[kind]), (cand, kind, checks[0]["failure"])
        for c in faulty["choices"]:
            assert c["candidate"] and f"{c['op']}/{c['candidate']}" not in bad, c
        assert faulty["cache_file"] != first["cache_file"]

        # An out-of-bounds write in each op's chosen candidate: no value changes, so only the guard
        # zones around the checks' buffers can see it. (gdn's recurrent kernels plant it
        # themselves: gdn.cu and gdn_recurrent_smem.cu.)
        oob = []
        for op in dict.fromkeys(c["op"] for c in first["choices"]):
            cands = {c["candidate"] for c in first["checks"] if c["candidate"].startswith(op + "/")}
            chosen = next(f"{op}/{c['candidate']}" for c in first["choices"] if c["op"] == op)
            if len(cands) >= 2 and chosen != "sampling/host":  # the CPU sampler writes no device buffer
                oob.append(chosen)
        env_o = dict(env, FATHOM_BACKEND_FAULT=",".join(f"{c.replace('/', ':')}:oob" for c in oob))
        bounded = tune(a.fathom, a.config, tmp + "/e.json", env_o)
        for cand in oob:
            op, name = cand.split("/")
            checks = [c for c in bounded["checks"] if c["candidate"] == cand]
            assert checks and all(not c["passed"] for c in checks), (cand, checks)
            for c in checks:
                assert "out-of-bounds write" in c["failure"] and f"{op} candidate {name} at " in c["failure"], \
                    (cand, c["failure"])
        innocent = [c for c in bounded["checks"] if c["candidate"] not in oob and not c["passed"]]
        assert not innocent, innocent  # the guards blame the faulty candidate only
        for c in bounded["choices"]:
            assert c["candidate"] and f"{c['op']}/{c['candidate']}" not in oob, c
        assert bounded["cache_file"] not in (first["cache_file"], faulty["cache_file"])
        clean = tune(a.fathom, a.config, tmp + "/d.json", env, no_cache=False)
        assert clean["from_cache"] and clean["choices"] == first["choices"]
    print(f"first tuning {first['seconds']:.1f} s, cached {again['seconds']:.2f} s; faults {bad} rejected; "
          f"out-of-bounds writes in {oob} rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
