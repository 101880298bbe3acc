"""The router benchmark: a worker or an echo upstream, direct and through `omni router`."""
