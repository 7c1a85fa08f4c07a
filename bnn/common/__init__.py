"""What the commands above it share, and nothing of the differentiable path: ``runlock`` (one
writer per run folder), ``jsonl`` (journals of one JSON object a line, appended whole),
``liveness`` (a worker process dies with its parent) and ``stats`` (means, paired t-intervals,
Spearman's rho). The search and the evidence grid both import it, never each other."""
