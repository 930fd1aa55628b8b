"""Configuration search: vary a tier's declared knobs (engine.techniques.all_knobs) over a prompt suite and seeds,
judge every candidate against same-seed baselines with the subject-aware gates, and keep the cost/quality Pareto
front in an Optuna study under the studio's data dir (resumable).

    space.py     which knobs vary, validated against their declarations
    spec.py      a search's JSON: space, prompts, seeds, budget, clip settings
    evaluate.py  one candidate on one (prompt, seed): measured cost and the gates (EngineEvaluator)
    study.py     the Optuna study: objectives, constraints, early stop, resume, report and front
    __main__.py  python -m studio.search start|resume|show|knobs (progress on stderr, JSON on stdout)
"""

from .evaluate import CaseResult, EngineEvaluator, Evaluator
from .space import SearchSpace
from .spec import SearchSpec
from .study import OBJECTIVES, SearchCancelled, SearchRun, load, names, report

__all__ = ["OBJECTIVES", "CaseResult", "EngineEvaluator", "Evaluator", "SearchCancelled", "SearchRun",
           "SearchSpace", "SearchSpec", "load", "names", "report"]
