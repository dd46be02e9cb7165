"""Reward-model scoring: the batching worker service and the clients that reach any backend."""
