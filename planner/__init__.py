"""HexiScale planner: cluster/model/plan specs, cost model, partitioning and search. Never imports torch."""
