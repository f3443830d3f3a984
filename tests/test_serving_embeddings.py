"""``POST /v1/embeddings`` through the openai client: the vectors LLM.embed gives, and the slots' caches untouched."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_serving_http import API_KEY, SERVED, client, server  # noqa: F401  (the module-scoped server)

TEXTS = ["The capital of France is Paris.", "Bananas are yellow."]


def test_embeddings_are_the_normalized_mean_of_the_final_hidden_states(client):
    from ggflow.api import LLM

    out = client.embeddings.create(model="smollm2", input=TEXTS)
    got = np.array([d.embedding for d in out.data])
    assert [d.index for d in out.data] == [0, 1] and out.usage.prompt_tokens > 0
    reference = LLM(n_ctx=256, n_threads=1, pooling_type="mean")
    want = np.array(reference.embed(TEXTS, normalize=True))
    assert got.shape == want.shape == (2, reference.n_embd())
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    # the same kernels over the same tokens from position 0: equal up to float32 rounding of the pooling
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_embeddings_leave_the_slots_caches_as_they_were(client):
    prompt = "Once upon a time there was a"
    first = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0)
    client.embeddings.create(model="smollm2", input="something else entirely")
    again = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0)
    assert again.choices[0].text == first.choices[0].text
    engine = SERVED["engine"]
    assert engine.ctx.embeddings is False


def test_bad_embedding_inputs_are_400s(client):
    import openai
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.embeddings.create(model="smollm2", input=[[1, 2, 10**9]])
    with pytest.raises(openai.BadRequestError, match="encoding_format"):
        client.embeddings.create(model="smollm2", input="x", encoding_format="hex")


def test_float_and_base64_encodings_carry_the_same_vector(client):
    as_float = client.embeddings.create(model="smollm2", input="Hello", encoding_format="float")
    as_b64 = client.embeddings.create(model="smollm2", input="Hello")   # the client asks for base64, decodes it
    np.testing.assert_array_equal(np.float32(as_float.data[0].embedding), np.float32(as_b64.data[0].embedding))
