"""`fathom tune` on the GPU (issue 19), at Qwen3.5-397B-A17B's shapes: every candidate of every
op (dense and NVFP4 products, NVFP4 experts, attention, delta rule, sampling) passes its checks
on a healthy GPU and the first tuning takes under 60 s; the cache answers a second run under
2 s; with faults injected into each op's chosen candidate (NaN, an illegal address, wrong values
in turn) each is rejected with its failed check named, other verified candidates are chosen, and
the faulty runs keep a cache entry of their own.

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
        clean = tune(a.fathom, a.config, tmp + "/d.json", env, no_cache=False)
        assert clean["from_cache"] and clean["choices"] == first["choices"]
    print(f"first tuning {first['seconds']:.1f} s, cached {again['seconds']:.2f} s; faults {bad} rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
