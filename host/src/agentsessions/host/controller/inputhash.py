"""The model-input hash (invariant I0): defined once, in ``agentsessions.sdk.inputhash``, so a
harness (and the SDK's test kit) computes the very hash the host checks on replay."""

from agentsessions.sdk.inputhash import encode_model_request, model_input_hash

__all__ = ["encode_model_request", "model_input_hash"]
