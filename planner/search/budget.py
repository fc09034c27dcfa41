"""The search's stop signal: raised while scoring when the evaluation budget or the time limit is
spent (by :meth:`planner.search.planner.Search.check_budget`), caught by each search phase."""


class BudgetSpent(Exception):
    """The evaluation budget or the time limit of the search is spent."""
