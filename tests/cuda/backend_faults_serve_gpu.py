"""`fathom serve` with faults injected into every op's preferred kernel (issue 19), on the GPU:
the server starts (on each op's next candidate), its log names each rejected candidate with the
check it failed (an out-of-bounds write among them: the guard zones' check), and its greedy
completions equal those of a server without faults (the embedded default model: a trained model,
whose greedy choices do not hang on the last bits the other kernels round differently), their
token logprobs within rounding. With every candidate of an op faulty (gdn.decode's two),
start-up ends with an error naming the op (checked last). The same comparison for the
SM120 profile (FATHOM_SM120_PROFILE=1: only kernels within SM120's 99 KB of shared memory).

Run by ctest (label gpu) as: python3 backend_faults_serve_gpu.py --fathom BIN --model DIR
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import serve_proc  # noqa: E402

# Each op's fixed-rule candidate, and the fault it gets: NaN, wrong values, an illegal address, or
# a write just past its output (oob: the values right, only the checks' guard zones see it).
FAULTS = {
    "gemm.bf16/gemv": "oob",
    "attention.decode/tensor-core": "wrong",
    "attention.prefill/tensor-core": "crash",
    "gdn.prefill/chunked": "nan",
    "gdn.decode/recurrent": "crash",
    "sampling/device": "wrong",
}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]


LOGPROB_BOUND = 0.25  # nats: bf16 activations rounded differently over the layers


def complete(port, prompt):
    choice = serve_proc.post(port, "/v1/completions",
                             {"prompt": prompt, "max_tokens": 48, "temperature": 0, "logprobs": 1})["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def compare(name, clean, other):
    """Equal greedy texts; returns the largest token-logprob difference."""
    worst = 0.0
    for q, (x, lx), (y, ly) in zip(PROMPTS, clean, other):
        assert x == y, f"{name}, {q!r}: {x!r} normally, {y!r} here"
        worst = max([worst] + [abs(a - b) for a, b in zip(lx, ly)])
    assert worst <= LOGPROB_BOUND, (name, worst)
    return worst


SERVE_ARGS = ["--device", "cuda", "--max-model-len", "1024"]


def run(fathom, model, env, log_path):
    with serve_proc.serving(fathom, model, SERVE_ARGS, env, log_path) as port:
        outs = [complete(port, q) for q in PROMPTS]
    return outs, open(log_path).read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp)
        env.pop("FATHOM_BACKEND_FAULT", None)
        clean, clean_log = run(a.fathom, a.model, env, tmp + "/clean.log")
        for cand in FAULTS:  # the faults go into what a healthy GPU chooses
            op, c = cand.split("/")
            assert f"  {op}, steps of up to" in clean_log, (op, clean_log[-3000:])
        spec = ",".join(f"{k.replace('/', ':')}:{v}" for k, v in FAULTS.items())
        faulty, faulty_log = run(a.fathom, a.model, dict(env, FATHOM_BACKEND_FAULT=spec), tmp + "/faulty.log")
        expect = {"nan": "NaN/Inf", "wrong": "", "crash": "illegal memory access",
                  "oob": "out-of-bounds write"}
        for cand, kind in FAULTS.items():
            line = next((l for l in faulty_log.splitlines() if f"rejected {cand} " in l), None)
            assert line and expect[kind] in line, (cand, kind, line)
            op, c = cand.split("/")
            chosen = [l for l in faulty_log.splitlines() if l.startswith(f"fathom:   {op}, steps of up to")]
            assert chosen and all(f": {c} " not in l and not l.endswith(f": {c}") for l in chosen), (cand, chosen)
        faulty_diff = compare("faults", clean, faulty)
        profile, profile_log = run(a.fathom, a.model, dict(env, FATHOM_SM120_PROFILE="1"), tmp + "/sm120.log")
        assert "SM120 profile" in profile_log, profile_log[-3000:]
        profile_diff = compare("SM120 profile", clean, profile)
        # Every candidate of an op faulty: start-up stops with the op named.
        both = "gdn.decode:recurrent:nan,gdn.decode:recurrent-smem:wrong"
        p, port = serve_proc.start(a.fathom, a.model, SERVE_ARGS, dict(env, FATHOM_BACKEND_FAULT=both), tmp + "/stop.log")
        if port:
            serve_proc.stop(p)
            raise SystemExit("the server started without a verified gdn.decode kernel")
        stop = open(tmp + "/stop.log").read()
        assert "gdn.decode" in stop and "no verified candidate" in stop, stop[-2000:]
    print(f"faults {FAULTS} rejected; {len(PROMPTS)} greedy completions equal (logprobs within {faulty_diff:.3g}); "
          f"SM120 profile equal (within {profile_diff:.3g}); faults in all of gdn.decode stop start-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
