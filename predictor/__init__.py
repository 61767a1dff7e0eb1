"""Output-length predictors (proxy, retrieval, iterative); never imports daemon/."""

from predictor.api import PredictInput, Predictor
from predictor.loader import default_iterative_path, default_predictor_path, load_predictor
from predictor.records import Message, Record

__all__ = ["Message", "PredictInput", "Predictor", "Record", "default_iterative_path",
           "default_predictor_path", "load_predictor"]
