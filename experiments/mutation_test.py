"""Mutation testing of the bounds, verifiers and report layer (outside CI: minutes to hours).

Two modes:

* ``--directed`` (default): deliberate value-changing bugs (in the bounds, the verifiers, the
  decoder at T != 1, the tables at several temperatures, the greedy law's ties, checkpoints and
  caches) and earlier defects, each applied alone to a fresh copy of the committed tree
  (``git archive HEAD``) and run against the tests that should catch it. Prints one line per
  mutant, ``caught`` or ``SURVIVED``; exits 1 if any survived. About 10 minutes on 2 cores
  (24 mutants; docs/results/mutation-testing.md).

      python experiments/mutation_test.py

* ``--mutmut PATH [PATH ...] --tests TEST [TEST ...]``: mutmut (``pip install mutmut``) over the
  given modules with the given tests, in a copy of the tree; prints ``mutmut results`` (the
  surviving mutants). Hours for a whole module on 2 cores: give narrow targets, e.g.

      python experiments/mutation_test.py --mutmut otbound/report/_measure.py --tests tests/test_report_layer.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VALUES = "tests/test_value_classes.py"

# (name, file, original text, mutated text, tests that must fail)
DIRECTED = [
    ("cluster CI from cluster means instead of sums", "otbound/report/_measure.py",
     "sums = np.array([np.sum(x[g == lab] - mean) for lab in labels])",
     "sums = np.array([np.mean(x[g == lab] - mean) for lab in labels])",
     ["tests/test_report_layer.py"]),
    ("efficiency interval not divided by α*", "otbound/report/_measure.py",
     "efficiency_ci=r_h / o if o > 0", "efficiency_ci=r_h if o > 0", ["tests/test_report_layer.py"]),
    ("efficiency inverted in the synthetic report", "otbound/report/_synthetic.py",
     "efficiency=acc / opt if opt > 0", "efficiency=opt / acc if acc > 0",
     ["tests/test_reliability.py::test_report_records_effective_settings_and_its_values_follow_from_its_rows"]),
    ("greedy tie rule flipped", "otbound/token/_kernel.py",
     "np.flatnonzero(q == thr)[: m - above.size]", "np.flatnonzero(q == thr)[::-1][: m - above.size]",
     ["tests/test_report_layer.py::test_greedy_tie_convention_is_pinned"]),
    ("1 − M by cancellation (candidate cut)", "otbound/token/_search.py",
     "rest = np.delete(q, top[: k - 1]).sum() if m > 0.5 else _total(q, runs) - m", "rest = 1.0 - m",
     ["tests/test_properties.py"]),
    ("tiny tokens dropped without the error bound", "otbound/token/_wor.py",
     "drop = tiny & (q < NEGLIGIBLE * rest / (k * q.size))", "drop = tiny",
     ["tests/test_properties.py"]),
    ("trace checksums not checked", "otbound/lm/_store.py",
     "    check_digests(path, tensors, meta[\"sha256\"])\n", "",
     ["tests/test_reliability.py::test_damaged_traces_are_detected_and_recollected"]),
    ("measurement cache reused whatever its key", "otbound/report/_measure.py",
     "elif stored.get(\"config\") == config:", "elif True:",
     ["tests/test_reliability.py::test_measurement_cache_is_keyed_by_trace_content"]),
    ("resume batches only the missing traces", "otbound/lm/_traces.py",
     "for p, path in zip(prompts, row)),", "for p, path in zip(prompts, row) if path in missing),",
     ["tests/test_fault_injection.py::test_killed_tiny_model_report_resumes_bit_for_bit"]),
    ("output folder not locked", "otbound/cli/compare.py",
     "with output_lock(options.out):", "with open(os.devnull):",
     ["tests/test_reliability.py::test_second_run_on_a_folder_is_refused_naming_the_holder"]),
    ("--mc-samples 0 silently replaced", "otbound/cli/_common.py",
     "raise argparse.ArgumentTypeError(f\"must be a positive integer, got {text!r}\")", "return 20_000",
     ["tests/test_reliability.py"]),
    # tables at several temperatures: a cell shown under another temperature's heading
    ("main table ignores the temperature of its rows", "otbound/report/tables.py",
     'sel = [r for r in rows if r["temperature"] == temperature and r["num_drafts"] == num_drafts]',
     'sel = [r for r in rows if r["num_drafts"] == num_drafts]',
     [f"{VALUES}::test_main_tables_at_several_temperatures_show_each_row_in_its_own_cell"]),
    ("paper table reads every row's cells at the first temperature", "otbound/report/tables.py",
     "r = lookup.get((d, t, k, v))", 'r = lookup.get((d, sel[0]["temperature"], k, v))',
     [f"{VALUES}::test_paper_tables_at_several_temperatures_show_each_row_in_its_own_cell"]),
    ("synthetic shards all computed at the first temperature", "otbound/report/_synthetic.py",
     "temperature=float(t), num_drafts_list", "temperature=float(temperatures[0]), num_drafts_list",
     [f"{VALUES}::test_synthetic_report_at_two_temperatures_alpha_cells_match_a_recomputation"]),
    # greedy law with ties among the top K - 1 draft tokens (different p on the tied tokens)
    ("batched greedy bound: ties at the edge of G not repaired", "otbound/token/_kernel.py",
     "for row in torch.nonzero(tied).flatten().tolist():", "for row in []:",
     [f"{VALUES}::test_greedy_ties_batched_measurement_matches_the_per_row_bound"]),
    ("batched greedy bound: ties inside G not detected", "otbound/token/_kernel.py",
     " | (vals[:, 1:] == vals[:, :-1]).any(1)", "",
     [f"{VALUES}::test_greedy_ties_batched_measurement_matches_the_per_row_bound"]),
    ("greedy top tokens: ties inside G ordered by higher index", "otbound/token/_kernel.py",
     "part[np.lexsort((part, -q[part]))]", "part[np.lexsort((-part, -q[part]))]",
     [f"{VALUES}::test_greedy_ties_batched_measurement_matches_the_per_row_bound"]),
    # the decoder at temperatures other than 1
    ("decoder drafts from the draft law at T = 1", "otbound/lm/_specsample.py",
     "laws = laws_from_logits(lg, settings, ctx)", "laws = laws_from_logits(lg, 1.0, ctx)",
     [f"{VALUES}::test_speculative_sample_is_lossless_at_temperatures_other_than_one"]),
    ("decoder verifies against the draft law at T = 1", "otbound/lm/_specsample.py",
     "q = laws_from_logits(q_logits, sq,", "q = laws_from_logits(q_logits, 1.0,",
     [f"{VALUES}::test_speculative_sample_is_lossless_at_temperatures_other_than_one"]),
    ("decoder verifies against the target law at T = 1", "otbound/lm/_specsample.py",
     "p = laws_from_logits(p_logits, sp, ctx)", "p = laws_from_logits(p_logits, 1.0, ctx)",
     [f"{VALUES}::test_speculative_sample_is_lossless_at_temperatures_other_than_one"]),
    # checkpoints of another model pair (same shard ids) in the same folder
    ("shard fingerprint without the pair", "otbound/report/_distributed.py",
     'f"{self.fn.__module__}.{self.fn.__qualname__}", self.pair, kwargs]',
     'f"{self.fn.__module__}.{self.fn.__qualname__}", kwargs]',
     [f"{VALUES}::test_run_shards_never_reuses_another_pairs_checkpoint"]),
    ("a folder's traces claimed by any pair", "otbound/report/_real.py",
     "if held is not None and held != name:", "if False:",
     [f"{VALUES}::test_real_report_rerun_with_another_pair_does_not_reuse_the_old_pair"]),
    ("pair name of a loaded pair not its own", "otbound/report/_distributed.py",
     "return str(pair.name)", 'return "pair"',
     [f"{VALUES}::test_real_report_rerun_with_another_pair_does_not_reuse_the_old_pair"]),
    # stored results
    ("shard checkpoint checksum not checked", "otbound/report/_distributed.py",
     'ok = isinstance(stored, dict) and stored.get("sha256") == _result_digest(stored["result"])', "ok = True",
     ["tests/test_bad_input.py::test_damaged_checkpoint_is_recomputed_not_reused"]),
]


def _copy_tree(dest: Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _pytest(tree: Path, tests, timeout=1800) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout).returncode


def directed(only=None) -> int:
    survivors = 0
    for name, file, old, new, tests in DIRECTED:
        if only and only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            _copy_tree(tree)
            path = tree / file
            text = path.read_text()
            if text.count(old) != 1:
                print(f"STALE     {name}: the original text is not found once in {file}")
                survivors += 1
                continue
            path.write_text(text.replace(old, new))
            caught = _pytest(tree, tests) != 0
        survivors += not caught
        print(f"{'caught  ' if caught else 'SURVIVED'}  {name}  ({file}; {' '.join(tests)})", flush=True)
    return 1 if survivors else 0


def run_mutmut(paths, tests) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        with open(tree / "setup.cfg", "a") as fh:
            fh.write("\n[mutmut]\npaths_to_mutate=" + ",".join(paths) + "\n")
            fh.write("pytest_add_cli_args_test_selection=" + ",".join(tests) + "\n")
            fh.write("also_copy=tests/,data/,experiments/\n")
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=tree, env=env)
        return subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=tree, env=env).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutmut", nargs="+", metavar="PATH", help="modules to mutate with mutmut")
    ap.add_argument("--tests", nargs="+", default=["tests"], help="tests run against each mutmut mutant")
    ap.add_argument("--only", default=None, help="directed mutants whose name contains this text")
    args = ap.parse_args(argv)
    return run_mutmut(args.mutmut, args.tests) if args.mutmut else directed(args.only)


if __name__ == "__main__":
    sys.exit(main())
