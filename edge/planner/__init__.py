"""The split planner: where each request runs (edge only, split, cloud only) — see cost.py."""
