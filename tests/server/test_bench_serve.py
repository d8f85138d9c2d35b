"""`fathom bench serve` against a `fathom serve` on the CPU (tiny fixture): fixed concurrency and
Poisson arrivals, prompt and output lengths drawn within --random-range-ratio, a sampling mix with
a share of logprobs requests (checked on the server's counters), the goodput line and the asked
percentiles, the prefix-repeat and multi-turn datasets (served from the prefix cache, exact
repeats from prompt ends, conversations from the host tier), and clear errors for bad flags.

Run by ctest as: python3 test_bench_serve.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import os
import re
import subprocess
import sys

from server_util import Server, check, summary


def bench(fathom, url, *flags):
    out = subprocess.run([fathom, "bench", "serve", "--url", url, "--no-progress", "--vocab-size", "200", *flags],
                         capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout, out.stderr


def field(text, name):
    m = re.search(r"^" + re.escape(name) + r"\s+(\S+)$", text, re.M)
    assert m, f"no '{name}' line in:\n{text}"
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    model = os.path.join(args.fixtures, "qwen35_moe")
    srv = Server(args.fathom, model, "--skip-tokenizer-init", "--chunked-prefill-size", "32")
    try:
        @check("fixed concurrency: lengths within the range ratio, every request counted, percentiles printed")
        def _():
            rc, out, err = bench(args.fathom, srv.url, "--concurrency", "3", "--num-prompts", "12", "--input-len",
                                 "40", "--output-len", "6", "--random-range-ratio", "0.5",
                                 "--metric-percentiles", "50,90,99")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 12
            assert field(out, "Failed requests:") == 0
            assert field(out, "Maximum request concurrency:") == 3
            inputs, outputs = field(out, "Total input tokens:"), field(out, "Total generated tokens:")
            assert 12 * 20 <= inputs <= 12 * 60 and inputs != 12 * 40, inputs  # drawn, not all 40
            assert 12 * 3 <= outputs <= 12 * 9, outputs
            for key in ("TTFT", "TPOT", "ITL", "E2EL"):
                for p in ("Median", "P90", "P99"):
                    field(out, f"{p} {key} (ms):")
            assert "Request goodput" not in out  # no SLOs given
        _()

        @check("request rate: Poisson arrivals under a concurrency cap, and a goodput line")
        def _():
            rc, out, err = bench(args.fathom, srv.url, "--request-rate", "40", "--max-concurrency", "2",
                                 "--num-prompts", "10", "--input-len", "16", "--output-len", "4",
                                 "--goodput", "ttft:60000", "tpot:60000")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 10
            assert field(out, "Request rate configured (RPS):") == 40
            assert field(out, "Maximum request concurrency:") == 2
            # Generous SLOs: every request is good.
            assert field(out, "Request goodput (req/s):") == field(out, "Request throughput (req/s):")
            rc, out, err = bench(args.fathom, srv.url, "--request-rate", "40", "--num-prompts", "6", "--input-len",
                                 "16", "--output-len", "4", "--goodput", "ttft:0.001")
            assert rc == 0, err
            assert field(out, "Request goodput (req/s):") == 0  # nobody meets a 1-microsecond TTFT
        _()

        @check("sampling mix (temperature, top_p, logprobs on a share of the requests): every request succeeds")
        def _():
            before = srv.metric("fathom:requests_received_total")
            rc, out, err = bench(args.fathom, srv.url, "--concurrency", "4", "--num-prompts", "8", "--input-len",
                                 "12", "--output-len", "5", "--temperature", "0.8", "--top-p", "0.95", "--logprobs",
                                 "3", "--logprobs-fraction", "0.25")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 8
            assert srv.metric("fathom:requests_received_total") - before == 8
        _()

        @check("prefix-repeat and multi-turn datasets: the shared prefix and the conversations come from the cache")
        def _():
            rc, out, err = bench(args.fathom, srv.url, "--dataset", "prefix-repeat", "--prefix-len", "288",
                                 "--input-len", "8", "--output-len", "3", "--num-prompts", "6", "--concurrency", "2")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 6
            # The first request prefills the 288 shared tokens; the other five start from its snapshot.
            assert field(out, "Prefix cache hit rate (%, prompt tokens):") > 50, out
            rc, out, err = bench(args.fathom, srv.url, "--dataset-name", "multi-turn", "--num-turns", "3",
                                 "--input-len", "16", "--output-len", "4", "--num-prompts", "6", "--concurrency", "2")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 6
            for turn in (1, 2, 3):
                field(out, f"Median TTFT turn {turn} (ms):")
            assert field(out, "Prefix cache hit rate (%, prompt tokens):") > 0, out
        _()

        @check("exact repeats (prefix-repeat, --input-len 0): every request after the first starts from its prompt end")
        def _():
            rc, out, err = bench(args.fathom, srv.url, "--dataset", "prefix-repeat", "--prefix-len", "40", "--input-len",
                                 "0", "--output-len", "3", "--num-prompts", "5", "--concurrency", "1", "--seed", "7")
            assert rc == 0, err
            assert field(out, "Total input tokens:") == 5 * 40
            assert field(out, "Prefix cache hit rate (%, prompt tokens):") == 80, out
        _()

        @check("bad flags: one-line errors that name them")
        def _():
            for flags, word in ((["--goodput", "latency:5"], "latency"), (["--goodput", "ttft"], "ttft"),
                                (["--random-range-ratio", "1.5"], "--random-range-ratio"), (["--input-len", "0"], "--input-len"),
                                (["--logprobs", "25"], "--logprobs"), (["--dataset-name", "sharegpt"], "dataset-name"),
                                (["--max-active-conversations", "-1"], "--max-active-conversations")):
                rc, out, err = bench(args.fathom, srv.url, "--num-prompts", "1", *flags)
                assert rc != 0, flags
                assert word in err, (flags, err)
        _()
    finally:
        srv.stop()
    # No room for snapshots beside the host tier (the fixture's are a few KB: 1 MB would keep them all):
    # every entry lives in host memory and comes back on its hit.
    tiered = Server(args.fathom, model, "--skip-tokenizer-init", "--prefix-cache-mb", "0", "--prefix-cache-host-gb", "1")
    try:
        @check("the host tier: multi-turn conversations the device has no room for are served from host memory")
        def _():
            rc, out, err = bench(args.fathom, tiered.url, "--dataset-name", "multi-turn", "--num-turns", "4",
                                 "--input-len", "48", "--output-len", "4", "--num-prompts", "16", "--concurrency", "4")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 16
            assert field(out, "  from the host tier (%):") > 30, out
            assert tiered.metric("fathom:prefix_cache_onloaded_snapshots_total") > 0
            # Two clients taking the turns of 6 conversations in turn: each comes back after the others.
            rc, out, err = bench(args.fathom, tiered.url, "--dataset-name", "multi-turn", "--num-turns", "3",
                                 "--input-len", "48", "--output-len", "4", "--num-prompts", "18", "--concurrency", "2",
                                 "--max-active-conversations", "6", "--seed", "3")
            assert rc == 0, err
            assert field(out, "Successful requests:") == 18
            assert field(out, "  from the host tier (%):") > 30, out
        _()
    finally:
        tiered.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
