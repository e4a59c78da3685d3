"""Deployable exports of the biLM: a ``torch.export`` program of its inference path (character ids → all layers +
mask, from an explicit LSTM state) packaged with AOTInductor (``.pt2``) or as an ONNX model (dynamo exporter), with a
dynamic batch size and sentence length; and :func:`load_exported` to run either as a callable.

``export_model(bilm, "model.pt2", "pt2")`` / ``elmokit export MODEL model.onnx --format onnx``; see
:mod:`elmokit.export.files` for the program's signature and :mod:`elmokit.export.program` for how the recurrence
is written (a masked ``scan``)."""

from elmokit.export.files import FORMATS, INPUT_NAMES, OUTPUT_NAMES, check_exportable, export_model, metadata
from elmokit.export.program import InferenceProgram
from elmokit.export.runtime import ExportedBiLM, ExportedOutput, load_exported

__all__ = [
    "FORMATS",
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "ExportedBiLM",
    "ExportedOutput",
    "InferenceProgram",
    "check_exportable",
    "export_model",
    "load_exported",
    "metadata",
]
