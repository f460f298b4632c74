"""A transformers + torch backend with dynamic batching: CPU here, GPU where there is one.

One worker thread owns the model. Requests that arrive while others are generating join the running batch at the
next step: each new prompt is prefilled on its own, then its key/value cache is left-padded and stacked onto the
batch's, so that every decoding step runs all active sequences in one forward pass. Finished or cancelled sequences
leave the batch at once, and padding columns no sequence needs any more are cut away. Several clients therefore
raise the throughput instead of queueing one behind another.

Sampling is per request (each row of the batch its own settings): logit bias, transformers' repetition penalty,
OpenAI's presence and frequency penalties and a grammar mask adjust the logits; then greedy at temperature 0, otherwise
temperature, top-k, min-p and top-p with a per-request seed. The log-probability of each chosen token and the most
likely alternatives come from the model's own distribution, before any adjustment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from turnkit.quiet import progress_bars
from turnkit.serve.engines.base import Generation, GenerationRequest, Inbox, InboxFront, TokenEvent
from turnkit.serve.request_fields import EngineKind

__all__ = ["TorchBackend"]

log = logging.getLogger("turnkit.serve")


@dataclass
class _Sequence:
    request: GenerationRequest
    generation: Generation
    generator: Any
    last_token: int = -1
    produced: int = 0
    counts: dict[int, int] = field(default_factory=dict)  # generated token id -> times


class TorchBackend(InboxFront):
    """Serves a causal language model loaded with transformers. Build it with :meth:`load`."""

    kind: ClassVar[EngineKind] = "torch"

    def __init__(
        self,
        model: Any,
        *,
        name: str,
        context_length: int,
        max_batch: int = 16,
        max_queue: int = 64,
        queue_timeout: float | None = 60.0,
        vocabulary: int | None = None,
    ):
        """``vocabulary``: the tokenizer's ids (one past its largest); a model whose output layer has more rows
        (padded for speed, as Qwen's 151,936 for 151,665 ids) never samples the rows no token has."""
        import torch

        self.torch = torch
        self.model = model.eval()
        self.name = name
        self.context_length = context_length
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.device = next(model.parameters()).device
        self.vocabulary = vocabulary
        super().__init__(Inbox(max_batch, max_queue, queue_timeout=queue_timeout))
        self._active: list[_Sequence] = []
        self._cache: Any = None
        self._mask: Any = None
        self._thread = threading.Thread(target=self._run, name="turnkit-generate", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls, path: str | Path, *, threads: int | None = None, context: int | None = None, **kwargs: Any
    ) -> TorchBackend:
        """Load a Hugging Face folder or a GGUF file, on the GPU when there is one, else the CPU.

        A GGUF file is dequantized by transformers, which takes long; the result is saved once as a safetensors
        folder in turnkit's cache (keyed by the file's path, size and modification time) and loaded from there later.
        ``context`` (default: the model's ``max_position_embeddings``) longer than the model's is RoPE scaled with
        YaRN, as the llama.cpp engine does.
        """
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        path = Path(path)
        cuda = torch.cuda.is_available()
        dtype = torch.bfloat16 if cuda else torch.float32
        folder = _converted_gguf(path) if path.is_file() else path
        config = AutoConfig.from_pretrained(folder)
        trained = int(getattr(config, "max_position_embeddings", None) or 4096)
        if context is not None and context > trained:
            rope = dict(getattr(config, "rope_parameters", None) or {})
            rope.update(rope_type="yarn", factor=context / trained, original_max_position_embeddings=trained)
            config.rope_parameters = rope
            config.max_position_embeddings = context
            log.info("context %d: RoPE scaled with YaRN %gx past the trained %d", context, context / trained, trained)
        with progress_bars(shown=False):  # a local load: turnkit says what it loads
            model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=dtype)
        if cuda:
            model = model.to("cuda")  # type: ignore[arg-type]  # transformers types .to() through a wrapper
        name = path.stem if path.is_file() else path.name
        kwargs.setdefault("vocabulary", _tokenizer_ids(folder))
        return cls(model, name=name, context_length=context or trained, **kwargs)

    # -- the server's side (submit, load_now, stop_admitting, abort: the InboxFront's) ----------------------------

    def close(self) -> None:
        self._shut_down(self._thread, timeout=10)

    # -- the worker thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        torch = self.torch
        with torch.inference_mode():
            while not self._inbox.closed:
                try:
                    self._admit(block=not self._active)
                    if self._active:
                        self._step()
                except Exception as exc:
                    log.exception("generation step failed")
                    for sequence in self._active:
                        sequence.generation.close(RuntimeError(f"generation failed: {exc}"))
                    self._active, self._cache, self._mask = [], None, None
        for sequence in self._active:  # closed while generating: the streams end rather than wait forever
            sequence.generation.close()

    def _admit(self, *, block: bool) -> None:
        self._inbox.admit(lambda: len(self._active) < self.max_batch, self._prefill, block=block)

    def _prefill(self, request: GenerationRequest, generation: Generation) -> None:
        if generation.cancelled.is_set():
            generation.close()
            return
        torch = self.torch
        ids = torch.tensor([list(request.prompt_ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        generator = None
        if request.temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request.seed if request.seed is not None else torch.seed())
        sequence = _Sequence(request, generation, generator)
        if request.prompt_logprobs is not None:
            generation.prompt = self._prompt_logprobs(request.prompt_ids, out.logits[0], request.prompt_logprobs)
        (token,) = self._sample([sequence], out.logits[:, -1, :])
        if self._emit(sequence, token):
            return
        mask = torch.ones((1, ids.shape[1]), dtype=torch.long, device=self.device)
        self._join(out.cache, mask, sequence)

    def _prompt_logprobs(self, ids: Any, logits: Any, top: int) -> tuple[TokenEvent, ...]:
        """Each prompt token's log-probability given the tokens before it, and the ``top`` likeliest there."""
        torch = self.torch
        events = [TokenEvent(int(ids[0]))]
        for start in range(0, len(ids) - 1, 256):  # a slice at a time: vocabulary-wide rows add up
            rows = torch.log_softmax(logits[start : start + 256].float(), dim=-1)
            for n, row in enumerate(rows):
                if start + n + 1 >= len(ids):
                    break
                token = int(ids[start + n + 1])
                values, indices = row.topk(top) if top else ((), ())
                alternatives = tuple(zip(list(map(int, indices)), list(map(float, values)), strict=True))
                events.append(TokenEvent(token, float(row[token]), alternatives))
        return tuple(events)

    def _join(self, cache: Any, mask: Any, sequence: _Sequence) -> None:
        """Stack a prefilled sequence onto the running batch, left-padding whichever is shorter."""
        torch = self.torch
        if self._cache is None:
            self._cache, self._mask, self._active = cache, mask, [sequence]
            return
        width, new_width = self._mask.shape[1], mask.shape[1]
        size = max(width, new_width)
        for old_layer, new_layer in zip(self._cache.layers, cache.layers, strict=True):
            old_layer.keys = torch.cat([_pad_left(old_layer.keys, size), _pad_left(new_layer.keys, size)], dim=0)
            old_layer.values = torch.cat([_pad_left(old_layer.values, size), _pad_left(new_layer.values, size)], dim=0)
        self._mask = torch.cat([_pad_left_mask(self._mask, size), _pad_left_mask(mask, size)], dim=0)
        self._active.append(sequence)

    def _step(self) -> None:
        torch = self.torch
        active = self._active
        tokens = torch.tensor([[s.last_token] for s in active], dtype=torch.long, device=self.device)
        self._mask = torch.cat([self._mask, torch.ones((len(active), 1), dtype=torch.long, device=self.device)], 1)
        positions = self._mask.sum(dim=1, keepdim=True) - 1
        out = self.model(
            input_ids=tokens,
            attention_mask=self._mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
        )
        self._cache = out.cache
        chosen = self._sample(active, out.logits[:, -1, :])
        keep = [
            n for n, (sequence, token) in enumerate(zip(active, chosen, strict=True)) if not self._emit(sequence, token)
        ]
        if len(keep) < len(active):
            self._shrink(keep)

    def _shrink(self, keep: list[int]) -> None:
        """Drop finished rows, and padding columns that no remaining row needs."""
        torch = self.torch
        if not keep:
            self._active, self._cache, self._mask = [], None, None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self._mask.index_select(0, index)
        start = int((mask.cumsum(dim=1) == 0).sum(dim=1).min())  # the shortest left padding of the rows kept
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:, :]
            layer.values = layer.values.index_select(0, index)[:, :, start:, :]
        self._mask = mask[:, start:]
        self._active = [self._active[n] for n in keep]

    def _sample(self, sequences: list[_Sequence], logits: Any) -> list[TokenEvent]:
        torch = self.torch
        logits = logits.float()
        if self.vocabulary is not None and logits.shape[-1] > self.vocabulary:
            logits = logits[:, : self.vocabulary]  # rows past the tokenizer's ids: no token to sample
        logprobs = (
            torch.log_softmax(logits, dim=-1) if any(s.request.top_logprobs is not None for s in sequences) else None
        )
        out = []
        for row, sequence in enumerate(sequences):
            request = sequence.request
            scores = self._adjusted(sequence, logits[row])
            if request.temperature > 0:
                token = int(torch.multinomial(_filtered(torch, scores, request), 1, generator=sequence.generator))
            else:
                token = int(scores.argmax())
            if request.constraint is not None:
                request.constraint.consume(token)
            if logprobs is not None and request.top_logprobs is not None:
                values, indices = logprobs[row].topk(request.top_logprobs) if request.top_logprobs else ((), ())
                top = tuple(zip(list(map(int, indices)), list(map(float, values)), strict=True))
                out.append(TokenEvent(token, float(logprobs[row, token]), top))
            else:
                out.append(TokenEvent(token))
        return out

    def _adjusted(self, sequence: _Sequence, scores: Any) -> Any:
        """One row's logits after logit bias, penalties and the grammar mask (the row itself when none applies)."""
        torch = self.torch
        request = sequence.request
        bias = {t: b for t, b in request.logit_bias.items() if t < scores.shape[-1]}  # ids past the logits: no row
        if bias:
            scores = scores.clone()
            ids = torch.tensor(list(bias), dtype=torch.long, device=scores.device)
            scores[ids] += torch.tensor(list(bias.values()), dtype=scores.dtype, device=scores.device)
        if request.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(request.prompt_ids) | set(sequence.counts)), dtype=torch.long, device=scores.device
            )
            scores = scores.clone()
            values = scores[seen]
            penalty = request.repetition_penalty
            scores[seen] = torch.where(values > 0, values / penalty, values * penalty)
        if (request.presence_penalty or request.frequency_penalty) and sequence.counts:
            ids = torch.tensor(list(sequence.counts), dtype=torch.long, device=scores.device)
            times = torch.tensor(list(sequence.counts.values()), dtype=scores.dtype, device=scores.device)
            scores = scores.clone()
            scores[ids] -= times * request.frequency_penalty + request.presence_penalty
        if request.constraint is not None:
            scores = request.constraint.mask(scores.clone())
        return scores

    def _emit(self, sequence: _Sequence, event: TokenEvent) -> bool:
        """Deliver a token; True when the sequence is finished (stop id, budget, or cancelled)."""
        sequence.generation.put(event)
        sequence.produced += 1
        sequence.last_token = event.token_id
        sequence.counts[event.token_id] = sequence.counts.get(event.token_id, 0) + 1
        request = sequence.request
        if (
            event.token_id in request.stop_ids
            or sequence.produced >= request.max_tokens
            or sequence.generation.cancelled.is_set()
        ):
            sequence.generation.close()
            return True
        return False


def _filtered(torch: Any, scores: Any, request: GenerationRequest) -> Any:
    """The probabilities to sample from: softmax at the temperature, then top-k, min-p and top-p cut the tail."""
    probs = torch.softmax(scores / request.temperature, dim=-1)
    if 0 < request.top_k < probs.shape[-1]:
        kth = probs.topk(request.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if request.min_p > 0:
        probs = torch.where(probs < request.min_p * probs.max(), torch.zeros_like(probs), probs)
    if request.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cut = sorted_probs.cumsum(0) - sorted_probs > request.top_p * sorted_probs.sum()
        sorted_probs[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs


def _converted_gguf(path: Path) -> Path:
    """The model of a GGUF file as a plain safetensors folder in the cache, converted on first use."""
    from turnkit.cache import build_folder, cache_dir, file_key

    def convert(scratch: Path) -> None:
        from transformers import AutoModelForCausalLM

        log.info("converting %s to a safetensors folder (once)", path.name)
        # dequantizing and writing take long: bars on a terminal help; a log file or a pipe gets none
        with progress_bars(shown=True):
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
            # A model read from GGUF is flagged as quantized; the dequantized weights are plain ones.
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.config.architectures = [type(model).__name__]
            model.save_pretrained(scratch)

    return build_folder(cache_dir() / "models" / file_key(path), convert)


def _pad_left(tensor: Any, size: int) -> Any:
    import torch

    missing = size - tensor.shape[2]
    if missing <= 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([torch.zeros(shape, dtype=tensor.dtype, device=tensor.device), tensor], dim=2)


def _pad_left_mask(mask: Any, size: int) -> Any:
    import torch

    missing = size - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([torch.zeros((mask.shape[0], missing), dtype=mask.dtype, device=mask.device), mask], dim=1)


def _tokenizer_ids(folder: Path) -> int | None:
    """One past the largest id of the folder's ``tokenizer.json`` (added tokens included), ``None`` without one."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    vocabulary = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    return max(vocabulary.values()) + 1 if vocabulary else None
