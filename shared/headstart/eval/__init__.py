"""Evaluation: accuracy beside latency, so a faster path that changes answers must show it.

dataset → generator (a serving mode) → extract → executor (SQLite or
PostgreSQL, contained) → compare (Spider or BIRD rules) + exact match →
summary with 95% intervals → report (JSON, markdown, plot); compare_runs pairs
modes (flips, McNemar). Entry points: `cli.eval_command`, `cli.compare_command`.
"""
