"""otbound's asv (airspeed velocity) benchmarks: the public calls users make, on row families at small
and full vocabulary (``benchmarks/asv.conf.json``; figures in docs/results/performance.md)."""
