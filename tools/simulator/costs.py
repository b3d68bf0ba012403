"""What a simulated server's work costs, and the named profiles fitted to real servers.

An iteration (one forward pass) decoding ``B`` sequences and no prompt costs ``single_decode_s``
when ``B`` is 1 (if set), else ``fixed_s + per_decode_seq_s * B``. A pass that evaluates ``P``
prompt tokens of ``n`` prompts costs ``prefill_fixed_s + max(pass_floor_s, per_prefill_token_s *
P) + per_other_prompt_s * (n - 1) + prefill_decode_seq_s * B``: on a GPU a pass costs nearly the
same for one prompt token as for a few hundred (the weights are read once), so a prompt's marginal
cost starts above the floor. Every task the server launches blocks its loop ``task_overhead_s``
(template, tokenization, a sampled token, the HTTP round trip), and llama-server's host prompt cache
(``HostCacheCosts``) blocks it while it copies a slot's KV to or from host memory.

The profiles (``COSTS``, ``--sim-costs`` / ``--server engine:costs=NAME``):

* ``gpu-published`` (the code's default, ``EngineCosts()``): a consumer GPU serving an 8B model at
  4-bit, from published llama.cpp figures, without a floor, task overhead or host cache;
* ``gpu``: fitted to an H200 serving an 8B-llama-shaped model (``measured/measured-h200.md``) with
  flash attention on, as llama-server runs where it is built: a save or a load is a few bulk
  copies of 128 KiB a token at ~12 GB/s;
* ``gpu-fa-off``: the same server with flash attention compiled out, as it was measured: V is
  stored transposed and a save is thousands of small copies (~330 ms + 0.11 ms a token, a load
  ~250 ms + 0.04 ms a token), and each further prompt in a pass costs ~9 ms more;
* ``cpu``: the real llama-server of the tests (a tiny random model, 2 threads), its iteration costs
  measured there, with llama-server's own mechanics (host cache, task overhead, cancellation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCacheCosts:
    """llama-server's host-memory prompt cache (``--cache-ram``, ``--cache-idle-slots``).

    A request that keeps less than half of its slot's content, takes a slot by least-recent use, or
    named a slot that was busy saves that slot first (unless the cache holds its content already);
    then a saved prompt that shares more with the new one than the slot keeps is loaded. With
    ``idle_slots``, every task launch also saves each idle slot whose content changed since it was
    saved. The server's loop is blocked while it copies.
    """

    save_s: float
    save_per_token_s: float
    load_s: float
    load_per_token_s: float
    capacity_tokens: int
    """What ``--cache-ram`` holds, in tokens of KV; the oldest entries go first."""
    idle_slots: bool = True

    def save_seconds(self, tokens: int) -> float:
        """Return how long saving ``tokens`` of a slot blocks the loop."""
        return self.save_s + self.save_per_token_s * tokens

    def load_seconds(self, tokens: int) -> float:
        """Return how long loading ``tokens`` into a slot blocks the loop."""
        return self.load_s + self.load_per_token_s * tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCosts:
    """Cost model of one iteration and of a task, in seconds at ``speed == 1``.

    The defaults (``gpu-published``): a consumer GPU serving an 8B model at 4-bit with llama.cpp
    (decoding on the slow side of published figures, prompt processing mid-range). llama.cpp PR
    #15802 (RTX 3090, Llama 8B Q4_0) measures 155 tokens/s decoding one sequence and 469 tokens/s
    with four (6.5 ms and 8.5 ms an iteration); a community llama-bench report (dmatora/LLM-
    inference-speed-benchmarks #12, RTX 3080, Llama 3.1 8B Q4_K_M) gives 112 tokens/s generation
    and 3,807 tokens/s prompt processing. Here one sequence decodes in 9.5 ms (105 tokens/s), four
    in 14 ms (286 tokens/s), and a prompt token costs 0.15 ms (6,700 tokens/s).
    """

    fixed_s: float = 0.008
    per_prefill_token_s: float = 0.00015
    per_decode_seq_s: float = 0.0015
    single_decode_s: float | None = None
    """A pass decoding one sequence and no prompt (None: ``fixed_s + per_decode_seq_s``)."""
    prefill_fixed_s: float | None = None
    """The fixed part of a pass with prompt tokens (None: ``fixed_s``)."""
    pass_floor_s: float = 0.0
    """The least a pass's prompt tokens cost, however few."""
    prefill_decode_seq_s: float | None = None
    """What each decoding sequence adds to a pass with prompt tokens (None: ``per_decode_seq_s``)."""
    per_other_prompt_s: float = 0.0
    """What each prompt after the first adds to a pass."""
    task_overhead_s: float = 0.0
    """The loop blocked per task launched."""
    tokens_per_estimate: float = 1.0
    """The server's tokens per token of our estimate (four characters): its tokenizer's count."""
    cancel_notice_s: float = 0.0
    """How long a cancelled running sequence holds its slot (and decodes) before the server
    notices its client went away."""
    host_cache: HostCacheCosts | None = None

    def pass_seconds(self, prompt_tokens: int, prompts: int, decoding: int) -> float:
        """Return what one pass costs: ``prompt_tokens`` of ``prompts`` prompts, ``decoding`` more."""
        if prompt_tokens <= 0:
            if decoding == 1 and self.single_decode_s is not None:
                return self.single_decode_s
            return self.fixed_s + self.per_decode_seq_s * decoding
        fixed = self.fixed_s if self.prefill_fixed_s is None else self.prefill_fixed_s
        per_decode = (
            self.per_decode_seq_s
            if self.prefill_decode_seq_s is None
            else self.prefill_decode_seq_s
        )
        return (
            fixed
            + max(self.pass_floor_s, self.per_prefill_token_s * prompt_tokens)
            + self.per_other_prompt_s * max(0, prompts - 1)
            + per_decode * decoding
        )

    def scaled(self, factor: float) -> EngineCosts:
        """Return these costs on a machine ``factor`` times slower (every second ``factor`` times)."""

        def times(value: float | None) -> float | None:
            return None if value is None else value * factor

        cache = self.host_cache
        return replace(
            self,
            fixed_s=self.fixed_s * factor,
            per_prefill_token_s=self.per_prefill_token_s * factor,
            per_decode_seq_s=self.per_decode_seq_s * factor,
            single_decode_s=times(self.single_decode_s),
            prefill_fixed_s=times(self.prefill_fixed_s),
            pass_floor_s=self.pass_floor_s * factor,
            prefill_decode_seq_s=times(self.prefill_decode_seq_s),
            per_other_prompt_s=self.per_other_prompt_s * factor,
            task_overhead_s=self.task_overhead_s * factor,
            host_cache=None
            if cache is None
            else replace(
                cache,
                save_s=cache.save_s * factor,
                save_per_token_s=cache.save_per_token_s * factor,
                load_s=cache.load_s * factor,
                load_per_token_s=cache.load_per_token_s * factor,
            ),
        )

    def without_host_cache(self) -> EngineCosts:
        """Return these costs on a server started with ``--cache-ram 0``."""
        return replace(self, host_cache=None)


GPU_PUBLISHED_COSTS = EngineCosts()
"""The defaults: a consumer GPU, on which four sequences cost 1.5x one."""
GPU_COSTS = GPU_PUBLISHED_COSTS
"""The code's default costs (``gpu-published``), the name older callers use."""

CPU_COSTS = EngineCosts(
    fixed_s=0.0002, per_prefill_token_s=0.000029, per_decode_seq_s=0.0011
)
"""A CPU server's iterations, shaped on the real llama-server of the tests (a tiny model, 2
threads): one sequence decodes in 1.3 ms, two in 2.4 ms (1.85x), and a prompt token costs 29 us
(34,500 tokens/s). Iterations only: ``CPU_SERVER_COSTS`` adds the server's mechanics."""

KV_BYTES_PER_TOKEN_8B = 128 * 1024
"""An 8B llama's KV cache a token in F16 (32 layers x 8 KV heads x 128 x 2 x 2 bytes)."""
CACHE_RAM_BYTES = 8192 * 1024 * 1024
"""llama-server's default ``--cache-ram`` (8,192 MiB)."""
CANCEL_NOTICE_S = 0.5
"""A cancelled stream's slot was freed 320-660 ms after the close on the H200 run: the server
notices at its next token write, or within a second."""

GPU_FA_OFF_COSTS = EngineCosts(
    # Fitted to measured-h200.md: decode 5.3 ms with one sequence, 6.8 + 0.63 B ms with B >= 2;
    # a prompt pass max(13 ms, 0.063 ms a token) + 0.7 ms per decoding sequence; ~7 ms a task.
    fixed_s=0.0068,
    per_decode_seq_s=0.00063,
    single_decode_s=0.0053,
    prefill_fixed_s=0.0,
    pass_floor_s=0.013,
    per_prefill_token_s=0.000063,
    prefill_decode_seq_s=0.0007,
    per_other_prompt_s=0.009,
    task_overhead_s=0.007,
    # The run's llama tokenizer counted 1,330 tokens for an Assist prompt we estimate at 2,040.
    tokens_per_estimate=0.65,
    cancel_notice_s=CANCEL_NOTICE_S,
    host_cache=HostCacheCosts(
        save_s=0.33,
        save_per_token_s=0.00011,
        load_s=0.25,
        load_per_token_s=0.00004,
        capacity_tokens=CACHE_RAM_BYTES // KV_BYTES_PER_TOKEN_8B,
    ),
)
"""The H200 run as measured: flash attention compiled out (``measured/measured-h200.md``)."""

_BULK_COPY_PER_TOKEN_S = KV_BYTES_PER_TOKEN_8B / 12e9
GPU_H200_COSTS = replace(
    GPU_FA_OFF_COSTS,
    per_other_prompt_s=0.0,
    host_cache=HostCacheCosts(
        save_s=0.002,
        save_per_token_s=_BULK_COPY_PER_TOKEN_S,
        load_s=0.002,
        load_per_token_s=_BULK_COPY_PER_TOKEN_S,
        capacity_tokens=CACHE_RAM_BYTES // KV_BYTES_PER_TOKEN_8B,
    ),
)
"""The H200 fit with flash attention on (llama-server's default where it is built): a save or a
load is a few bulk copies, ~2 ms + 128 KiB a token at ~12 GB/s (16 ms for 1,300 tokens)."""

KV_BYTES_PER_TOKEN_TINY = 2 * 32 * 2 * 2
"""The tests' tiny model's KV a token (2 layers x 32 KV dimensions x K and V x F16 bytes)."""
CPU_SERVER_COSTS = replace(
    CPU_COSTS,
    task_overhead_s=0.001,
    # Its Qwen2 tokenizer counts 1.55 tokens for each we estimate on the benchmark's text.
    tokens_per_estimate=1.55,
    cancel_notice_s=CANCEL_NOTICE_S,
    host_cache=HostCacheCosts(
        save_s=0.0002,
        save_per_token_s=KV_BYTES_PER_TOKEN_TINY / 5e9,
        load_s=0.0002,
        load_per_token_s=KV_BYTES_PER_TOKEN_TINY / 5e9,
        capacity_tokens=CACHE_RAM_BYTES // KV_BYTES_PER_TOKEN_TINY,
    ),
)
"""The real llama-server of the tests with its mechanics: its iterations (``CPU_COSTS``), a task's
overhead, its cancellation notice and a host cache of a tiny model's KV (copies in host memory)."""

COSTS = {
    "gpu-published": GPU_PUBLISHED_COSTS,
    "gpu": GPU_H200_COSTS,
    "gpu-fa-off": GPU_FA_OFF_COSTS,
    "cpu": CPU_SERVER_COSTS,
}
"""The named profiles (see the module docstring)."""
DEFAULT_PROFILE = "gpu-published"
