"""
The text side of a run: the format a completion is asked to take (Template: the prompt, the think
tags and the answer tags), the tokenizers that turn it into ids (a Hugging Face tokenizer, or
CharTokenizer for the offline demos) and the ids that end a completion (stop_token_ids,
stop_sequences: the answer's close tag). Everything that writes or reads the tags derives from a
Template: the prompt and the response prefix it ends in (format_prompt), where sampling stops, the
warm start's targets (target_text), and in rewards.py the format reward and the answer-tag reading.

    template = template_of("r1_zero")                  # a TEMPLATES name ...
    template = template_of({"think": ("<reasoning>", "</reasoning>"),
                            "answer": ("<final>", "</final>")})
    format_prompt("What is 2+3?", template)            # ... or a dict of Template's fields
                                                       # (config key `template`)

A config names a template or spells one out as a dict; TrainConfig keeps it as the resolved dict
(template_dict), so config.json and every checkpoint hold the whole template and eval.py and
--resume use that very one. When the config loads, Template.check() says whether it is well formed
and rewards.check_template whether the rules read it.
"""
import dataclasses
import json
import os
import string
from dataclasses import dataclass

# DeepSeek-R1-Zero's prompt (arXiv:2501.12948, table 1), its tags filled in by format_prompt
R1_ZERO_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "{think_open} {think_close} and {answer_open} {answer_close} tags, respectively, i.e., "
    "{think_open} reasoning process here {think_close} {answer_open} answer here {answer_close}.")
# what a prompt text may name
FIELDS = ("question", "think_open", "think_close", "answer_open", "answer_close")


@dataclass(frozen=True)
class Template:
    """prompt: the text before the response, "{question}" where the question goes and {think_open},
    {think_close}, {answer_open}, {answer_close} where the tags' names go (literal braces are
    doubled, "{{"). chat: the prompt is the user turn of the tokenizer's own chat template and
    system its system turn. response_prefix: the text after the prompt (after the chat template's
    assistant header) that the completion continues; the format reward judges prefix + completion. A
    completion ends at the answer's close tag."""
    prompt: str = R1_ZERO_INSTRUCTION + " User: {question}\nAssistant: "
    think: tuple[str, str] = ("<think>", "</think>")
    answer: tuple[str, str] = ("<answer>", "</answer>")
    response_prefix: str = "{think_open}"
    chat: bool = False
    system: str = ""
    name: str = ""  # the TEMPLATES name, or "" for one spelled out in a config

    @property
    def prefix(self) -> str:
        """The response prefix with the tags filled in ("<think>")."""
        return self.fill(self.response_prefix)

    def fill(self, text: str, question: str = "") -> str:
        """text with its fields (FIELDS) filled in: the question and the tags."""
        return text.format(question=question, think_open=self.think[0], think_close=self.think[1],
                           answer_open=self.answer[0], answer_close=self.answer[1])

    def target_text(self, reasoning: str, answer: str) -> str:
        """What the warm start teaches after the prefix: the reasoning, the think block closed, the
        tagged answer; "" reasoning gives the answer alone."""
        return f"{reasoning}{self.think[1]} {self.answer[0]}{answer}{self.answer[1]}"

    def check(self):
        """A ValueError unless the template is well formed: its fields are known and the prompt
        names the question once; the four tags are non-empty, distinct, without surrounding
        whitespace and none inside another (a reader looking for one would find the other). Whether
        the rewards read it: rewards.check_template."""
        for label, text in (("prompt", self.prompt), ("system", self.system),
                            ("response_prefix", self.response_prefix)):
            try:
                names = [name for _, name, _,
                         _ in string.Formatter().parse(text) if name is not None]
            except ValueError as error:
                raise ValueError(f"template {label} {text!r}: {error} (write a literal brace as "
                                 "'{{' or '}}')") \
                    from None
            unknown = sorted(set(names) - set(FIELDS))
            if unknown:
                raise ValueError(f"template {label} names unknown field(s) {unknown}; it may name "
                                 f"{list(FIELDS)}")
            if label == "prompt" and names.count("question") != 1:
                raise ValueError("template prompt must name {question} exactly once, got "
                                 f"{text!r}")
        tags = [*self.think, *self.answer]
        if (len(self.think) != 2 or len(self.answer) != 2
            or not all(isinstance(t, str) and t for t in tags)):
            raise ValueError("template tags must be two pairs of non-empty strings (open, close), "
                             f"got think={self.think!r}, answer={self.answer!r}")
        for i, tag in enumerate(tags):
            if tag != tag.strip():
                raise ValueError(f"template tag {tag!r} has whitespace around it: the format "
                                 "reward judges the text between the tags with it stripped")
            others = tags[:i] + tags[i + 1:]
            inside = [other for other in others if tag in other]
            if tag in others or inside:
                where = "repeated" if tag in others else f"inside {inside[0]!r}"
                raise ValueError(f"template tag {tag!r} is {where}: a reader of one tag would find "
                                 f"the other; the four tags {tags} must differ")


TEMPLATES = {
    "r1_zero": Template(name="r1_zero"),
    # short, for tiny character-level models
    "plain": Template(prompt="Question: {question}\nAnswer: ", name="plain"),
    # the tokenizer's own chat template, the R1-Zero instruction as its system turn (for instruct
    # models)
    "chat": Template(prompt="{question}", chat=True, system=R1_ZERO_INSTRUCTION, name="chat"),
}
R1_ZERO = TEMPLATES["r1_zero"]  # the rewards' default


def template_of(spec) -> Template:
    """A Template from a TEMPLATES name, a dict of its fields (lists for the tag pairs do: JSON has
    no tuples) or a Template; a ValueError names what is wrong. Not checked: check() does that."""
    if isinstance(spec, Template):
        return spec
    if isinstance(spec, str):
        if spec not in TEMPLATES:
            raise ValueError(f"unknown prompt template {spec!r}; known templates: "
                             f"{sorted(TEMPLATES)}, or a dict of "
                             f"template.Template's fields")
        return TEMPLATES[spec]
    if not isinstance(spec, dict):
        raise ValueError(f"template must be a name from {sorted(TEMPLATES)} or a dict of "
                         f"template.Template's fields, got {spec!r}")
    known = {field.name for field in dataclasses.fields(Template)}
    if set(spec) - known:
        raise ValueError(f"template has unknown key(s) {sorted(set(spec) - known)}; "
                         f"template.Template has {sorted(known)}")
    return Template(**{key: (tuple(value) if key in ("think", "answer") and isinstance(value, list)
                             else value)
                       for key, value in spec.items()})


def template_dict(spec) -> dict:
    """The whole template as a dict (what config.json and a checkpoint record), from a name, dict or
    Template."""
    return dataclasses.asdict(template_of(spec))


def format_prompt(question: str, template, tokenizer=None) -> str:
    """The prompt text for one question, response prefix included; a chat template needs the
    tokenizer whose chat template it applies. template: a Template, a TEMPLATES name or a dict."""
    template = template_of(template)
    if not template.chat:
        return template.fill(template.prompt, question) + template.prefix
    if not getattr(tokenizer, "chat_template", None):
        which = ("no tokenizer was given" if tokenizer is None
                 else f"{type(tokenizer).__name__} has none")
        raise ValueError(f"template {template.name or 'chat'!r} applies the tokenizer's own chat "
                         f"template, and {which}: use a text template, one of "
                         f"{sorted(name for name, other in TEMPLATES.items() if not other.chat)}")
    messages = ([{"role": "system",
                  "content": template.fill(template.system)}] if template.system else []) + \
        [{"role": "user", "content": template.fill(template.prompt, question)}]
    return (tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            + template.prefix)


def encode_prompt(tokenizer, question: str, template) -> list[int]:
    """The prompt token ids for one question: format_prompt's text, encoded."""
    template = template_of(template)
    text = format_prompt(question, template, tokenizer)
    # a chat text holds its own specials
    return tokenizer.encode(text, add_special_tokens=not template.chat)

# -----------------------------------------------------------------------------
# tokenizers


CHAR_TOKENIZER_FILE = "char_tokenizer.json"  # CharTokenizer.save_pretrained's marker


class CharTokenizer:
    """One token per character: printable ASCII and newline, plus <|pad|> and <|endoftext|> (eos).
    Ids are fixed by this alphabet, so a checkpoint only records the name "char". Hugging Face's
    interface."""

    SPECIAL_TOKENS = ("<|pad|>", "<|endoftext|>")
    ALPHABET = "\n" + "".join(chr(code) for code in range(32, 127))

    def __init__(self):
        self.tokens = list(self.SPECIAL_TOKENS) + list(self.ALPHABET)
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self.pad_token_id, self.eos_token_id = self.ids["<|pad|>"], self.ids["<|endoftext|>"]

    def __len__(self) -> int:
        return len(self.tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; like Qwen's, no BOS/EOS is ever added, and special-token strings are
        plain text."""
        ids = []
        for position, char in enumerate(text):
            if char not in self.ALPHABET:
                raise ValueError(f"CharTokenizer cannot encode {char!r} at position {position}: "
                                 f"it knows printable ASCII and newline only")
            ids.append(self.ids[char])
        return ids

    def save_pretrained(self, directory: str):
        """A marker file, so that load_tokenizer(directory) gives this tokenizer back (e.g. a run's
        hf/ export)."""
        with open(os.path.join(directory, CHAR_TOKENIZER_FILE), "w") as f:
            json.dump({"tokenizer": "char", "alphabet": self.ALPHABET}, f)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ids (ints); special tokens dropped or written as their names."""
        pieces = []
        for token_id in map(int, ids):
            if not 0 <= token_id < len(self.tokens):
                raise ValueError(f"token id {token_id} is outside CharTokenizer's vocabulary of "
                                 f"{len(self.tokens)}")
            if token_id < len(self.SPECIAL_TOKENS) and skip_special_tokens:
                continue
            pieces.append(self.tokens[token_id])
        return "".join(pieces)


def load_tokenizer(name_or_path: str, gguf_file: str | None = None):
    """"char" (or a directory CharTokenizer.save_pretrained wrote) -> CharTokenizer(); else a
    Hugging Face tokenizer (hub name, local dir, or gguf_file in it), with a pad id guaranteed:
    batches are padded, so a tokenizer without one pads with eos."""
    if name_or_path == "char" or os.path.isfile(os.path.join(name_or_path, CHAR_TOKENIZER_FILE)):
        return CharTokenizer()
    # imported here: the character-level demo does not need transformers
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, gguf_file=gguf_file)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def stop_token_ids(tokenizer) -> list[int]:
    """Ids that end a completion, sorted: eos plus Qwen's two end markers where the vocabulary has
    them (a base model ends text with <|endoftext|>, a chat-tuned one a turn with <|im_end|>)."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[token] for token in ("<|im_end|>", "<|endoftext|>") if token in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("tokenizer has no eos token and no <|im_end|> or <|endoftext|>: nothing "
                         "can end a completion")
    return sorted(ids)


def stop_sequences(tokenizer, template) -> list[list[int]]:
    """Token sequences that end a completion (sample.generate's stop_sequences): each stop_token_ids
    id alone, then the template's answer close tag ("</answer>") as the tokenizer splits it amid the
    text a model likely writes before and after it, each split cut to the fewest tokens that hold
    the tag (a BPE merges " </" and ">\\n"), each distinct split once. template: a
    template.Template, a TEMPLATES name or a dict."""
    close = template_of(template).answer[1]
    sequences = [[i] for i in stop_token_ids(tokenizer)]
    for before in ("", " ", "\n"):
        for after in ("", "\n", "\n\n"):
            ids = tokenizer.encode(before + close + after, add_special_tokens=False)
            while close in tokenizer.decode(ids[1:]):
                ids = ids[1:]
            while close in tokenizer.decode(ids[:-1]):
                ids = ids[:-1]
            if ids not in sequences:
                sequences.append(ids)
    return sequences
