"""Load against a server on loopback: the one HTTP client (http_client.py), the load
generator (http_load.py: closed loop and Poisson arrivals), the serving metrics of request
timelines (stats.py: TTFT, TPOT, ITL, E2EL, goodput) and a real `aieng serve` process
(server_process.py). The gate, the benchmarks and the tests share them."""
