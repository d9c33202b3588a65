"""A running serving engine audited through its own API: llama.cpp's speculative decoding.

:class:`LlamaServer` runs ``llama-server`` (built by :func:`otbound.lm._llama_cpp.llama_cpp_build`)
on a free loopback port and always stops it. :func:`run_audit` (``python -m otbound.engine``) drives
it — or any running llama.cpp server given by URL — and reports, per configuration (speculative
type, draft length, ``p_min``, sampling settings): the engine's acceptance read from its
``/metrics`` counters (stored raw) with cluster-robust intervals; otbound's exact prediction for
draft-simple along the engine's own outputs, which is also the bound of that deterministic scheme;
the planner's best alternative at the same node budget; and a G-test of the engine's output law
against the target's exact post-sampling law, with a control run without speculation.
The laws come from a pluggable :class:`LawSource` (:class:`ServerLaws`: the engine's own
``n_probs``; :class:`TinyLaws`: an independent forward of the tiny GGUF pair).

Examples
--------
>>> from otbound.engine import Sampling, SpecConfig
>>> SpecConfig("draft-simple", 4, 0.0, Sampling.named("qwen")).label()
'draft-simple n_max=4 p_min=0 [qwen]'
"""

from otbound.engine._audit import SpecConfig, counter_metrics, hashed_seed
from otbound.engine._client import EngineError, parse_prometheus, spec_counters
from otbound.engine._laws import LawSource, Sampling, ServerLaws, TinyLaws, llama_sampler_law
from otbound.engine._lossless import detectable_tv, enumerate_cells, lossless_test
from otbound.engine._multidraft import (
                                       build_llama_speculative_kvu,
                                       build_log_flush_shim,
                                       run_llama_speculative,
                                       speculative_output_test,
)
from otbound.engine._report import load_engine_json, recompute_figures
from otbound.engine._run import ENGINE_FORMAT, REAL_CONFIGS, SYNTHETIC_CONFIGS, run_audit
from otbound.engine._server import SPEC_TYPES, LlamaServer, children_of, free_port

__all__ = [
    "ENGINE_FORMAT", "EngineError", "LawSource", "LlamaServer", "REAL_CONFIGS", "SPEC_TYPES", "SYNTHETIC_CONFIGS",
    "Sampling", "ServerLaws", "SpecConfig", "TinyLaws", "children_of", "counter_metrics", "detectable_tv",
    "free_port", "hashed_seed", "llama_sampler_law", "load_engine_json", "parse_prometheus", "recompute_figures",
    "run_audit", "spec_counters",
    "build_llama_speculative_kvu", "build_log_flush_shim", "run_llama_speculative", "speculative_output_test",
    "enumerate_cells", "lossless_test",
]
