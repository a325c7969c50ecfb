"""The Python API under odd arguments: ``Selector(model, **keywords, overrides=...)`` and
``explain(layer_index, layer_kind)`` either decide or raise a ``MoEPolicyError`` whose
origin names the argument (``api:...``); never another exception type."""

from __future__ import annotations

import contextlib
import json
import random
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from moe_policy.api import API_KEYS, Selector
from moe_policy.core.keys import CONTEXT_KEYS
from moe_policy.errors import MoEPolicyError, PolicyError
from tests.fuzz.generators import CONFIGS, MODEL_FILES, model_corpus, mutate_model
from tests.fuzz.keep import CI, SEEDS
from tests.fuzz.mutate import BACKENDS, STRINGS

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(STRINGS + BACKENDS + ("9.0", "10.0", "cuda", "cpu", "rocm", "2")),
    st.text(max_size=8),
    st.binary(max_size=4),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=2),
    st.tuples(SCALARS, SCALARS),
)
KEYWORDS = st.dictionaries(st.sampled_from([*API_KEYS, "capabilty"]), VALUES, max_size=4)
OVERRIDES = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from([*CONTEXT_KEYS, "backend", "mode", "audit.path", "priority", "nope"]),
        VALUES,
        max_size=3,
    ),
)


def model_argument(seed: int) -> object:
    """A shipped model config by path, or its mapping mutated (the API takes both)."""
    rng = random.Random(seed)
    name = rng.choice(MODEL_FILES)
    if rng.random() < 0.4:
        return str(CONFIGS / "models" / name)
    return mutate_model(rng, json.loads(model_corpus()[MODEL_FILES.index(name)]))


@settings(CI, max_examples=150)
@given(
    model_seed=SEEDS,
    keywords=KEYWORDS,
    overrides=OVERRIDES,
    layer_index=st.one_of(st.none(), st.integers(-3, 2**40), st.booleans(), st.text(max_size=3)),
    layer_kind=st.one_of(st.none(), st.sampled_from(["moe", "draft", "mtp", "shared", "x", ""])),
)
def test_odd_api_arguments_decide_or_raise_a_policy_error(
    model_seed, keywords, overrides, layer_index, layer_kind
):
    model = model_argument(model_seed)
    with tempfile.TemporaryDirectory() as where, contextlib.chdir(where):  # audit_log="x"
        try:
            selector = Selector(model, environ={}, overrides=overrides, **keywords)
            selector.explain(layer_index, layer_kind)
        except PolicyError as exc:
            assert exc.origin, f"{exc!r} names no origin"
        except MoEPolicyError:  # no feasible backend, a refusal in strict mode
            pass
