"""Text prompts reach every length on the real tokenizer (issue 18, item 3).

`xover ttft --text` used to fail or succeed depending on the seed ("no prefix of the drafted text is
exactly 8 tokens"): on tiny-moe's byte-level vocabulary a cut just after a space was stripped to one
token short and no longer cut was tried. Here the fitted prompts are checked against the real
llama-server's ``/tokenize`` (with ``add_special``, what ``/completion`` applies to a text prompt):

* a hypothesis property over seeds, prompt indices and lengths (2..1500 tokens), on tiny-moe and on
  tiny-moe with ``add_bos_token`` set (BOS is then one of the L tokens);
* 20 consecutive seeds at the issue's 8 tokens and at 300, each also sent cold to ``/completion``,
  whose ``prompt_n`` must be exactly L.

One server per test (on 2 threads, ``-c`` small: tokenizing needs no context).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xover.client.http import completion_body
from xover.domain.config import LlamaConfig
from xover.domain.prompts import TextPrompts
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, context_size
from xover.measure.ttft import check_cache

pytestmark = pytest.mark.real

EXAMPLES = 60  # per vocabulary


@pytest.fixture(scope="module")
def bos_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-moe with ``tokenizer.ggml.add_bos_token`` flipped to true (the preset says false)."""
    import gguf

    path = tmp_path_factory.mktemp("bos") / "tiny-moe-bos.gguf"
    shutil.copy(tiny_model, path)
    field = gguf.GGUFReader(path, "r+").get_field("tokenizer.ggml.add_bos_token")
    assert field is not None
    field.parts[field.data[0]][0] = True
    return path


class _Server:
    """A real llama-server held across many synchronous calls (hypothesis examples are synchronous)."""

    def __init__(self, bins: Binaries, model: Path, log_dir: Path, max_len: int = 1024) -> None:
        self.loop = asyncio.new_event_loop()
        spec = ServerLaunch(LlamaConfig("fit", settings=(("threads", "2"),)), model, context_size(max_len, 16))
        self.srv = LlamaServer(bins.server, spec, log_dir)

    def __enter__(self) -> _Server:
        self.loop.run_until_complete(self.srv.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.loop.run_until_complete(self.srv.__aexit__(*exc))
        finally:
            self.loop.close()

    def count(self, text: str) -> int:
        assert self.srv.client is not None
        return len(self.loop.run_until_complete(self.srv.client.tokenize(text, add_special=True)))

    def fit(self, seed: int, index: int, length: int) -> str:
        assert self.srv.client is not None
        client = self.srv.client

        async def count(text: str) -> int:
            return len(await client.tokenize(text, add_special=True))

        prompt = self.loop.run_until_complete(TextPrompts(seed).make(index, length, count)).prompt
        assert isinstance(prompt, str)
        return prompt

    def cold_prompt_n(self, text: str) -> str | None:
        assert self.srv.client is not None
        rec = self.loop.run_until_complete(
            self.srv.client.stream_completion(completion_body(text, 2, cache_prompt=False))
        )
        assert rec.result.error is None, rec.result.error
        return check_cache("cold", self.count(text), rec.result.timings)


@pytest.mark.parametrize("vocab", ["tiny-moe", "tiny-moe+bos"])
def test_every_seed_and_length_reaches_exactly_L_on_the_real_tokenizer(
    vocab: str, llama_bins: Binaries, tiny_model: Path, bos_model: Path, tmp_path: Path
) -> None:
    model = bos_model if vocab.endswith("+bos") else tiny_model
    with _Server(llama_bins, model, tmp_path) as server:
        assert (server.count("ab") == 3) == vocab.endswith("+bos")  # BOS counted where the model adds it

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        @given(seed=st.integers(0, 2**31 - 1), index=st.integers(0, 10_000), length=st.integers(2, 1500))
        def reaches(seed: int, index: int, length: int) -> None:
            prompt = server.fit(seed, index, length)
            assert server.count(prompt) == length, (seed, index, length, prompt[-40:])

        reaches()


def test_twenty_seeds_at_the_issue_length_and_each_prompt_is_evaluated_as_L(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    with _Server(llama_bins, tiny_model, tmp_path) as server:
        for seed in range(20):
            for index, length in ((0, 8), (1, 300)):
                prompt = server.fit(seed, index, length)
                assert server.count(prompt) == length, (seed, length, prompt)
                assert server.cold_prompt_n(prompt) is None  # cache_n == 0 and prompt_n == L on /completion
