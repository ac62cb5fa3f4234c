"""`dlrover-events bench brain`: the brain's latency and throughput on a real broker."""
