"""``ChatFormat``: one checkpoint's chat format, the object every part of turnkit works from.

A ``ChatFormat`` holds the template(s) of a checkpoint, or of a built-in family, and the special tokens the template
reads. Training data, evaluation and the server all render through the same object, so they cannot drift apart.

It is the facade: construction, what the format holds, rendering and encoding are here; reading replies (the reply
format chosen from the template, the ids that end a reply, the parsers) is :class:`~turnkit.replies.Replies`, which
it holds as ``replies`` and hands ``parse`` and ``stream_parser`` to. The two directions share only the template and
the tokenizer, so each is its own room and neither grows with the other.

>>> from turnkit import ChatFormat
>>> fmt = ChatFormat.from_family("chatml")
>>> fmt.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnkit import families
from turnkit.errors import TemplateNotFoundError, TokenizerError
from turnkit.families.spec import Family
from turnkit.messages import Conversation, normalize_conversation
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.render import Rendered, RenderLimits
from turnkit.template.sandbox import compile_template
from turnkit.template.sources import TemplateSet, load_gguf, load_hf_folder

if TYPE_CHECKING:
    from turnkit.encode.encoder import Encoder
    from turnkit.encode.encoding import Encoding
    from turnkit.encode.options import EncodeOptions
    from turnkit.encode.prefix import PrefixReport, PromptDiff
    from turnkit.parse.choice.select import Choice
    from turnkit.parse.formats import ReplyFormat
    from turnkit.parse.reading.parser import StreamParser
    from turnkit.parse.reply import EndReason, Reply
    from turnkit.replies import Replies
    from turnkit.template.switches import ThinkingSwitch
    from turnkit.tokenizer import StopSet, TokenizerBinding
    from turnkit.trajectory import History, Trajectory

__all__ = ["ChatFormat"]

Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


def _bind(tokenizer: Any) -> Callable[[], TokenizerBinding] | None:
    if tokenizer is None:
        return None

    def load() -> TokenizerBinding:
        from turnkit.tokenizer import TokenizerBinding

        return TokenizerBinding.from_any(tokenizer)

    return load


def _checkpoint(path: Path) -> tuple[TemplateSet, Callable[[], TokenizerBinding]]:
    """A checkpoint's templates (each compiled now, so that a broken one fails here with its line), and how to load
    its tokenizer when it is first needed."""
    if path.is_dir():
        templates = load_hf_folder(path)
    elif path.is_file() and path.suffix.lower() == ".gguf":
        templates = load_gguf(path)
    elif path.is_file():
        raise TemplateNotFoundError(f"{path} is neither a model folder nor a .gguf file")
    else:
        raise TemplateNotFoundError(f"{path} does not exist")
    for source in templates.templates.values():
        compile_template(source)

    def load() -> TokenizerBinding:
        from turnkit.tokenizer import TokenizerBinding

        if path.is_dir():
            return TokenizerBinding.from_folder(path)
        return TokenizerBinding.from_gguf(path)

    return templates, load


@dataclass(frozen=True)
class ChatFormat:
    """The chat format of a checkpoint or of a built-in family.

    Build one with :meth:`from_pretrained` (a Hugging Face folder or a ``.gguf`` file), :meth:`from_template`
    (template text) or :meth:`from_family` (``chatml``, ``llama3``, ``plain``, ``qwen2.5``).
    """

    templates: TemplateSet
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    family: Family | None = None
    limits: RenderLimits = field(default_factory=RenderLimits)
    #: Loads the tokenizer on first use (a checkpoint's own; rendering never needs it).
    tokenizer_loader: Callable[[], TokenizerBinding] | None = field(default=None, repr=False, compare=False)

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_template(
        cls,
        text: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        tokenizer: Any = None,
        limits: RenderLimits | None = None,
        **special_tokens: str,
    ) -> ChatFormat:
        """A format from template text. Special tokens given here become template variables (``bos_token`` ...).

        ``tokenizer`` (a fast ``transformers`` tokenizer or a ``tokenizers.Tokenizer``) is what :meth:`encode` uses.
        """
        if not isinstance(text, str):
            raise TypeError(f"the template must be text, got {type(text).__name__}")
        compile_template(text)  # fail now, with the line number, rather than at the first render
        tokens = {k: v for k, v in {"bos_token": bos_token, "eos_token": eos_token, **special_tokens}.items() if v}
        return cls(
            TemplateSet({"default": text}), tokens, limits=limits or RenderLimits(), tokenizer_loader=_bind(tokenizer)
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, *, limits: RenderLimits | None = None) -> ChatFormat:
        """A format from a Hugging Face model folder or a GGUF file, read the way transformers reads it."""
        templates, load = _checkpoint(Path(path))
        return cls(templates, dict(templates.special_tokens), limits=limits or RenderLimits(), tokenizer_loader=load)

    @classmethod
    def from_family(
        cls, family: str | Family, *, tokenizer: Any = None, limits: RenderLimits | None = None
    ) -> ChatFormat:
        """A format from a built-in family, by name or as a :class:`~turnkit.families.Family`."""
        spec = families.get(family) if isinstance(family, str) else family
        templates = TemplateSet({"default": spec.template}, origin=f"family {spec.name}")
        return cls(
            templates,
            dict(spec.special_tokens),
            family=spec,
            limits=limits or RenderLimits(),
            tokenizer_loader=_bind(tokenizer),
        )

    def with_tokenizer(self, tokenizer: Any) -> ChatFormat:
        """A copy that encodes with ``tokenizer`` (a fast transformers tokenizer or a ``tokenizers.Tokenizer``)."""
        return replace(self, tokenizer_loader=_bind(tokenizer))

    def with_template(self, text: str) -> ChatFormat:
        """Another template over this format's tokenizer and special tokens (a per-model or per-request override)."""
        special_tokens: dict[str, Any] = dict(self.special_tokens)
        return ChatFormat.from_template(text, tokenizer=self.tokenizer, limits=self.limits, **special_tokens)

    def with_limits(self, limits: RenderLimits) -> ChatFormat:
        """A copy that renders under other limits (``RenderLimits(timeout_s=None)`` turns the time limit off)."""
        return replace(self, limits=limits)

    # -- what it holds ------------------------------------------------------------------------------------------------

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def template_names(self) -> list[str]:
        return self.templates.names

    def template(self, name: str | None = None, *, tools: object = None) -> str:
        """The template text used for a render with these arguments (selected as transformers selects it)."""
        return self.templates.select(name, tools=tools)[1]

    def thinking_switch(self, name: str | None = None, *, tools: object = None) -> ThinkingSwitch:
        """The variable(s) the template reads to turn reasoning on or off (:mod:`turnkit.template.switches`)."""
        from turnkit.template.switches import thinking_switch

        return thinking_switch(self.template(name, tools=tools))

    # -- rendering ----------------------------------------------------------------------------------------------------

    def render(
        self,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        template_name: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation to the exact text the template makes (as ``apply_chat_template(tokenize=False)``).

        Args:
            messages: Dicts or :class:`~turnkit.Message` objects; validated, ``None`` values dropped.
            tools: JSON-schema dicts or Python functions (schema from type hints and docstring).
            documents: Retrieval documents, for templates that render them (dicts with ``title`` and ``text``).
            add_generation_prompt: End with the header of a new assistant turn.
            continue_final_message: Leave the last message open so that the model continues it; ``True`` continues
                ``content``, a field name (``"reasoning_content"``) continues that field.
            template_name: Pick a named template of the checkpoint (``tool_use`` is picked when tools are given).
            template_kwargs: More template variables (``enable_thinking=False``, ``date_string=...``); they override
                the special tokens of the same name.

        Raises:
            MessageError: A message is malformed (the error names its index and field).
            TemplateError: The template refused the conversation (``raise_exception``) or failed.
            TemplateSecurityError: The template tried to leave the sandbox.
            TemplateLimitError: The template ran too long or built too much text.
        """
        return self.render_with_spans(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_name=template_name,
            **template_kwargs,
        ).text

    def render_with_spans(
        self,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        template_name: str | None = None,
        track_generation: bool = False,
        with_data_spans: bool = False,
        **template_kwargs: Any,
    ) -> Rendered:
        """Like :meth:`render`, also returning the character spans of ``{% generation %}`` blocks when tracked, and
        with ``with_data_spans`` the spans of text that came from data (messages, tools, documents), which tell a
        marker the template wrote from one a user typed."""
        return self.chat_template.render(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_name=template_name,
            track_generation=track_generation,
            with_data_spans=with_data_spans,
            template_kwargs=template_kwargs,
        )

    @cached_property
    def chat_template(self) -> ChatTemplate:
        """What the layers below this one (encoding, parsing) know of the format: templates, variables, limits, and
        what it declares about ending a reply."""
        family = self.family
        return ChatTemplate(
            self.templates,
            self.special_tokens,
            self.limits,
            end_markers=family.stop_tokens if family else (),
            stop_strings=family.stop_strings if family else (),
            reply_format=family.reply_format if family else None,
        )

    # -- encoding -----------------------------------------------------------------------------------------------------

    @cached_property
    def tokenizer(self) -> TokenizerBinding:
        """The tokenizer, loaded on first use (a HF folder's own, or transformers' reading of a GGUF file)."""
        if self.tokenizer_loader is None:
            raise TokenizerError(
                "this ChatFormat has no tokenizer: build it with from_pretrained, or pass tokenizer= to "
                "from_template / from_family, or call with_tokenizer()"
            )
        return self.tokenizer_loader()

    @cached_property
    def encoder(self) -> Encoder:
        from turnkit.encode.encoder import Encoder

        return Encoder(self.chat_template, self.tokenizer, self.stops)

    @cached_property
    def stops(self) -> StopSet:
        """The ids that end a reply (end-of-turn markers and EOS ids): what masks train and what generation stops on."""
        from turnkit.tokenizer import StopSet

        template = self.chat_template
        return StopSet.build(self.tokenizer, (*template.end_markers, template.eos_token or ""))

    def encode(
        self, messages: Conversation, options: EncodeOptions | None = None, /, **keywords: Any
    ) -> Encoding | list[Encoding]:
        """Encode a conversation to token ids, safely, with labels and per-token attribution.

        Data (message content, tool calls and results, tool schemas, documents, template keyword arguments) can
        never produce a control token: a user who types ``<|im_end|>`` gets the text ``<|im_end|>``. On data without
        control-token strings the ids equal ``apply_chat_template(..., tokenize=True)``'s.

        Settings come as an :class:`~turnkit.encode.EncodeOptions` or as keywords named like its fields (any other
        keyword is a template variable, e.g. ``enable_thinking=False``):

        * ``tools``, ``documents``, ``add_generation_prompt``, ``template_name``: as for :meth:`render`;
        * ``turns``: which assistant turns to train: ``"all"``, ``"last"`` or ``"none"``; a message's own
          ``"train": true/false`` overrides it;
        * ``train_end_marker``: train each trained turn's end-of-turn marker (``<|im_end|>``);
        * ``masks``: ``"auto"`` (``{% generation %}`` blocks when the template has them, else the turns),
          ``"turns"`` or ``"generation"``;
        * ``trust_data``: let control-token strings in data through as control tokens (loud; trusted data only);
        * ``attribution``: fill ``message_index`` and ``is_data`` (a pipeline that needs only ids and labels skips it);
        * ``split_turns``: return a list, one example per trained assistant turn, each holding the conversation up to
          that turn and training only it, so that every turn is trained in the context the model sees at inference
          (for templates that are not prefix-stable, see :meth:`check_prefix_stable`).

        Raises:
            EmptyMaskError: Nothing would be trained (without ``add_generation_prompt``).
            EncodeError: The template is not prefix-stable where a turn must be located (use ``split_turns``).
        """
        from turnkit.encode.options import EncodeOptions

        return self.encoder.encode(messages, EncodeOptions.from_keywords(options, **keywords))

    def encode_batch(
        self,
        conversations: Sequence[Conversation | Mapping[str, Any]],
        options: EncodeOptions | None = None,
        /,
        **keywords: Any,
    ) -> list[Encoding] | list[list[Encoding]]:
        """Encode many conversations at once (each a list of messages, or a dict with ``messages``, ``tools`` and
        ``documents``), with the same settings as :meth:`encode`.

        The same results as :meth:`encode` one by one, faster: tokenization runs in the tokenizer's own threads
        (``TOKENIZERS_PARALLELISM`` / ``RAYON_NUM_THREADS``), and text that repeats across conversations (system
        prompts, tool schemas) is tokenized once and cached.
        """
        from turnkit.encode.options import EncodeOptions

        return self.encoder.encode_batch(conversations, EncodeOptions.from_keywords(options, **keywords))

    # -- parsing ------------------------------------------------------------------------------------------------------

    @cached_property
    def replies(self) -> Replies:
        """The reply side of this format (:mod:`turnkit.replies`): the calls below hand down to it."""
        from turnkit.replies import Replies

        return Replies(self.chat_template, lambda: self.tokenizer, lambda: self.stops)

    @cached_property
    def reply_choice(self) -> Choice:
        """The reply format chosen for this template by rendering probe replies, with what the probes showed
        (:func:`turnkit.parse.choice.select.choose`): which replies the template writes, which the format reads back,
        and whether the template writes tool calls that nothing reads."""
        return self.replies.choice

    @property
    def reply_format(self) -> ReplyFormat:
        """How this format's replies write reasoning and tool calls, chosen from what the template writes; its
        ``reason`` says which reading was chosen and why (pass ``reply_format=`` to a parse to override)."""
        return self.reply_choice.format

    @property
    def stop_ids(self) -> dict[int, tuple[EndReason, str]]:
        """Every id that ends a reply, with why: the template's end-of-turn markers and the checkpoint's EOS ids."""
        return self.replies.stop_ids

    def stream_parser(
        self,
        *,
        prompt: Sequence[int] | str | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Iterable[int] | None = None,
        tools: Tools | None = None,
        reply_format: str | ReplyFormat | None = None,
        call_id: Callable[[int], str] | None = None,
        strict: bool = False,
        text: bool = False,
    ) -> StreamParser:
        """A push parser for one reply: ``feed(token_ids) -> deltas``, then ``finish() -> Reply``.

        Args:
            prompt: The prompt the reply continues (ids or text); after a pre-written ``<think>``, in reasoning.
            stop: Stop strings of the request, of any length, matched across token boundaries; the parser never
                emits any part of one. The family's own stop strings (``plain``: ``"\\nuser:"``) always apply too.
            stop_token_ids: More ids that end the reply (vLLM's field), beside the format's own :attr:`stop_ids`:
                for a template whose reply ends at the next role's marker. The reply ends at one with end reason
                ``stop_token`` (``finish_reason`` ``stop``); its text is not the reply's. Only for a parser fed ids.
            tools: The tools offered (schemas or functions); a call to another name gets status ``unknown_tool``.
            reply_format: A reply format name (``hermes``, ``qwen3``, ``llama3``, ``mistral``, ``reasoning``,
                ``plain``) or a :class:`~turnkit.parse.ReplyFormat`; inferred from the format when omitted.
            call_id: Makes the id of a tool call written without one, from its index (by default random ids of
                the shape the template takes back, ``replies.call_ids``: ``call_...``, or Mistral's nine
                letters and digits); a call the model wrote with an id keeps it.
            strict: ``finish()`` raises :class:`~turnkit.errors.ReplyParseError` when the reply does not end cleanly
                (a failed tool call, or cut off: see ``Reply.ended_cleanly``) instead of returning it.
            text: A parser fed text (``feed_text``), for replies that only exist as text: the markers written in it
                count, as :meth:`parse` reads a ``str``.
        """
        spec = reply_format or self.reply_format
        return self.replies.parser(prompt, stop, stop_token_ids, tools, spec, call_id, strict, text=text)

    def parse(
        self,
        reply: Sequence[int] | str,
        *,
        prompt: Sequence[int] | str | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Iterable[int] | None = None,
        tools: Tools | None = None,
        reply_format: str | ReplyFormat | None = None,
        length: bool = False,
        call_id: Callable[[int], str] | None = None,
        strict: bool = False,
    ) -> Reply:
        """Parse a whole reply (token ids, or text for replies that only exist as text) into a :class:`Reply`.

        ``length=True`` says the token budget ran out (``finish_reason="length"`` unless a stop came first). A reply
        given as text has no ids to go by, so the markers written in it count: ``"Hi<|im_end|>"`` ends at the
        marker. ``strict=True`` raises :class:`~turnkit.errors.ReplyParseError` for a reply that does not end
        cleanly; otherwise failed calls are returned with their status; ``stop_token_ids`` are more ids that end the
        reply (see :meth:`stream_parser`).
        """
        spec = reply_format or self.reply_format
        text = isinstance(reply, str)
        parser = self.replies.parser(prompt, stop, stop_token_ids, tools, spec, call_id, strict, text=text)
        if isinstance(reply, str):
            parser.feed_text(reply)
        else:
            parser.feed(reply)
        return parser.finish(length=length)

    def check_prefix_stable(
        self, messages: Conversation, *, tools: Tools | None = None, **template_kwargs: Any
    ) -> PrefixReport:
        """Whether the serving prompt of each assistant turn is a prefix of the full training render, and where not.

        ``bool(report)`` is True when every turn is; ``str(report)`` shows where each unstable turn breaks.
        """
        from turnkit.encode.prefix import check_prefix_stable

        chat = normalize_conversation(messages, alias_reasoning=False)
        return check_prefix_stable(self.render, chat, tools=tools, **template_kwargs)

    def diff_prompts(
        self, training_messages: Conversation, *, tools: Tools | None = None, **template_kwargs: Any
    ) -> list[PromptDiff]:
        """Token by token, where each assistant turn's serving prompt leaves the training encoding."""
        from turnkit.encode.prefix import diff_prompts

        chat = normalize_conversation(training_messages, alias_reasoning=False)
        encode = partial(self.encode, turns="none")
        return diff_prompts(encode, lambda token_id: self._decode([token_id]), chat, tools=tools, **template_kwargs)

    def trajectory(
        self,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        history: History = "keep",
        stop_token_ids: Iterable[int] | None = None,
        **template_kwargs: Any,
    ) -> Trajectory:
        """An agent episode as exact ids, for RL: :class:`~turnkit.trajectory.Trajectory` (token in, token out).
        ``stop_token_ids``: more ids that end a reply, beside :attr:`stop_ids` (vLLM's field, as the engine is given
        them): a reply ending at one reads as stopped, not cut by the budget."""
        from turnkit.trajectory import Trajectory

        return Trajectory(
            self,
            messages,
            tools=tools,
            history=history,
            stop_token_ids=stop_token_ids,
            template_kwargs=template_kwargs,
        )

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def __repr__(self) -> str:
        what = f"family={self.family.name!r}" if self.family else f"origin={self.templates.origin!r}"
        return f"ChatFormat({what}, templates={self.template_names})"
