//! Server-sent events as backends stream them: splitting a byte stream into events, and reading
//! what the gateway meters from each OpenAI `data:` chunk (and from a whole non-streamed answer,
//! which has the same shape). MindIE's events and answers are read in `api::mindie`, by serde's
//! derive over `Loose` fields, which this module provides.
//!
//! Both are linear in the bytes. The splitter resumes its search for an event's end where the
//! last search stopped, so an event that arrives in many reads is scanned once. A chunk is read
//! by a strict JSON scanner (`api::scan`) that picks out only the fields metering needs and
//! passes over the rest without building it; a string is copied only when it has escapes, the
//! head every event of a stream repeats (`id`, `object`, `created`, `model`) is read once per
//! stream, and an event that is the last content event's bytes around another string is read
//! as that string alone ([`Chunk::parse_event`]).

use super::scan::{self, Kind, Scan};
use crate::wire::Framing;
use bytes::{Bytes, BytesMut};
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// Cuts a byte stream into complete SSE events (each ending in a blank line), none longer
/// than a bound: the buffer of an unfinished event never grows past it.
#[derive(Debug)]
pub struct SseSplitter {
    framing: Framing,
    buf: BytesMut,
    /// How much of `buf` has been searched: no event ends within it.
    searched: usize,
    max_event_bytes: usize,
    /// An event went over the bound: the split is over.
    overflowed: bool,
}

/// What one [`SseSplitter::push`] completed.
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    /// The events completed, in order, each with its trailing blank line.
    pub events: Vec<Bytes>,
    /// The same events as one slice of the bytes pushed, when they are: none of them began in
    /// an earlier push.
    pub run: Option<Bytes>,
    /// An event (complete or still growing) is longer than the bound: the events before it
    /// are in `events`, nothing after it is read.
    pub too_large: bool,
}

impl SseSplitter {
    /// A splitter for events of at most `max_event_bytes` (blank line included).
    pub fn new(max_event_bytes: u64) -> Self {
        Self::framed(max_event_bytes, Framing::Sse)
    }

    /// A splitter for events framed as `framing` says, of at most `max_event_bytes` (their end
    /// included).
    pub fn framed(max_event_bytes: u64, framing: Framing) -> Self {
        Self {
            framing,
            buf: BytesMut::new(),
            searched: 0,
            max_event_bytes: usize::try_from(max_event_bytes).unwrap_or(usize::MAX),
            overflowed: false,
        }
    }

    /// Adds bytes; returns the events completed by them. Events that lie whole in `bytes` are
    /// slices of it: only an event that begins in one push and ends in another is copied.
    pub fn push(&mut self, mut bytes: Bytes) -> Split {
        let mut split = Split {
            too_large: self.overflowed,
            ..Split::default()
        };
        if self.overflowed {
            return split;
        }
        if self.buf.is_empty() {
            // One search of the whole read for the byte that may end an event.
            let end = self.framing.end_byte();
            let (mut taken, mut from) = (0, 0);
            while let Some(found) = memchr::memchr(end, &bytes[from..]) {
                let mut at = from + found;
                if !ends_event(self.framing, &bytes[taken..at]) {
                    // The usual event ends in two: the second is looked at here, not searched
                    // for (an SSE event ends at any `\n` after a `\n`).
                    if bytes.get(at + 1) != Some(&end) {
                        from = at + 1;
                        continue;
                    }
                    at += 1;
                }
                from = at + 1;
                if at + 1 - taken > self.max_event_bytes {
                    break;
                }
                split.events.push(bytes.slice(taken..at + 1));
                taken = at + 1;
            }
            if taken > 0 {
                split.run = Some(bytes.split_to(taken));
            }
            // What is left needs no second search: no event ends in it, or the one that does
            // is over the bound.
            self.searched = bytes.len();
        }
        self.buf.extend_from_slice(&bytes);
        while let Some(end) = self.event_end() {
            if end > self.max_event_bytes {
                break;
            }
            split.events.push(self.buf.split_to(end).freeze());
            self.searched = 0;
        }
        // What is left is one event: unfinished, or finished but over the bound.
        if self.buf.len() > self.max_event_bytes {
            self.overflowed = true;
            self.buf = BytesMut::new();
            split.too_large = true;
        }
        split
    }

    /// What is left when the stream ends (an event without its blank line), if anything.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.searched = 0;
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    /// Where the first event in the buffer ends: after its first `\n\n` or `\r\n\r\n`, that
    /// is after the first `\n` that follows `\n` or `\r\n\r`. Only the part not searched yet is
    /// read; what precedes a `\n` is already in the buffer, so no `\n` needs a second look.
    fn event_end(&mut self) -> Option<usize> {
        let end = event_end(self.framing, &self.buf, self.searched);
        if end.is_none() {
            self.searched = self.buf.len();
        }
        end
    }
}

/// Where the first event in `buf` ends, framed as `framing` says, searching from `from` (no
/// event ends before it).
fn event_end(framing: Framing, buf: &[u8], from: usize) -> Option<usize> {
    memchr::memchr_iter(framing.end_byte(), &buf[from..])
        .map(|i| from + i)
        .find(|&at| ends_event(framing, &buf[..at]))
        .map(|at| at + 1)
}

/// Whether an event whose bytes so far are `before` ends with the [`Framing::end_byte`] that
/// follows them: a NUL always ends one; a `\n` ends an SSE event after `\n` or `\r\n\r` (its
/// blank line, `\n\n` or `\r\n\r\n`).
fn ends_event(framing: Framing, before: &[u8]) -> bool {
    match framing {
        Framing::Nul => true,
        Framing::Sse => before.ends_with(b"\n") || before.ends_with(b"\r\n\r"),
    }
}

/// The payload of an event framed as `framing` says: an SSE event's [`data`], a NUL-ended
/// event's text before its NUL (empty when it is not UTF-8).
pub fn payload(framing: Framing, event: &[u8]) -> Cow<'_, str> {
    match framing {
        Framing::Sse => data(event),
        Framing::Nul => {
            let text = event.strip_suffix(b"\0").unwrap_or(event);
            Cow::Borrowed(std::str::from_utf8(text).unwrap_or(""))
        }
    }
}

/// The `data:` payload of an event: its `data:` lines, each without one leading space, joined
/// with newlines. Borrowed from the event when it has one such line; empty when it has none or
/// is not UTF-8.
pub fn data(event: &[u8]) -> Cow<'_, str> {
    let Ok(text) = std::str::from_utf8(event) else {
        return Cow::Borrowed("");
    };
    // The usual event, one `data:` line and its blank line: read as the lines below read it,
    // without cutting it into them.
    if let Some(line) = text
        .strip_suffix("\n\n")
        .and_then(|t| t.strip_prefix("data:"))
    {
        if memchr::memchr(b'\n', line.as_bytes()).is_none() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            return Cow::Borrowed(line.strip_prefix(' ').unwrap_or(line));
        }
    }
    data_lines(text)
}

/// [`data`] of any event's text, line by line.
fn data_lines(text: &str) -> Cow<'_, str> {
    let mut lines = lines(text)
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d));
    let Some(first) = lines.next() else {
        return Cow::Borrowed("");
    };
    let mut rest = lines.peekable();
    if rest.peek().is_none() {
        return Cow::Borrowed(first);
    }
    let mut joined = first.to_string();
    for line in rest {
        joined.push('\n');
        joined.push_str(line);
    }
    Cow::Owned(joined)
}

/// `text`'s lines as [`str::lines`] cuts them (at `\n`, a `\r` before it dropped; no empty line
/// after a last `\n`), found with `memchr`'s vector search rather than a char pattern.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut ends = memchr::memchr_iter(b'\n', text.as_bytes());
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let Some(end) = ends.next() else {
            let last = &text[start..];
            start = text.len();
            return Some(last);
        };
        let line = &text[start..end];
        start = end + 1;
        Some(line.strip_suffix('\r').unwrap_or(line))
    })
}

/// An OpenAI completion or chat completion, whole or one chunk of a stream, as far as metering
/// reads it. A field of an unexpected type is ignored, as if absent; anything that is not a
/// JSON object (a stream's `[DONE]` included) reads as an empty chunk.
///
/// Read with `api::scan`, not serde's derive, so that a stream's events can be read from the end
/// of their repeated head ([`Chunk::parse_event`]: 0.75x the instructions per 200-event
/// answer, docs/performance.md). It reads every text as serde_json reads it into the derived
/// structs it replaced, which the tests keep and compare it with.
#[derive(Debug, Default)]
pub struct Chunk<'a> {
    /// `usage.completion_tokens`, when it is a whole number that fits a `u64`.
    completion_tokens: Option<u64>,
    /// `usage.prompt_tokens`, the same way.
    prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (vLLM's `--enable-prompt-tokens-details`),
    /// the same way.
    cached_tokens: Option<u64>,
    /// `choices` is an array with at least one element.
    any_choice: bool,
    /// The first choice's answer: which piece is its content, if any, and whether it calls
    /// tools; `None` when there is no choice.
    answer: Option<(Option<usize>, bool)>,
    /// The first piece of generated text, then the others in order.
    first_piece: Option<Cow<'a, str>>,
    more_pieces: Vec<Cow<'a, str>>,
}

/// The longest head [`Chunk::parse_event`] keeps: longer ones are read every time. The same
/// bounds each of an [`EventShape`]'s two parts.
const MAX_HEAD_BYTES: usize = 1024;

/// What a stream's events have been seen to repeat (see [`Chunk::parse_event`]). One per
/// stream.
#[derive(Debug, Default)]
pub struct EventHead {
    /// The bytes the events begin with before their first field metering reads, once an event
    /// has been read whole with them.
    head: Vec<u8>,
    /// The last event read whose only generated text was its first choice's content.
    shape: Option<EventShape>,
}

/// An event whose only generated text is its first choice's content, in a string without
/// escapes, and which carries no usage: its bytes before that string's body (through the
/// opening quote) and after it (from the closing quote on). Any text made of the same two
/// parts around another valid string body reads as the same chunk with that string's text:
/// reading the first part leaves the reader in the same place, a string changes nothing but
/// the text it holds, and the same second part then reads the same way.
#[derive(Debug)]
struct EventShape {
    before: Vec<u8>,
    after: Vec<u8>,
    /// Neither part holds a `\n`: an SSE event whose one `data:` line is this shape around a
    /// string has no other line ([`Chunk::parse_shaped_sse_event`]).
    one_line: bool,
}

impl EventShape {
    /// The shape of `chunk`, read from `json`, when it has one.
    fn of<'a>(json: &'a str, chunk: &Chunk<'a>) -> Option<Self> {
        let bare = chunk.any_choice
            && chunk.answer == Some((Some(0), false))
            && chunk.more_pieces.is_empty()
            && (
                chunk.completion_tokens,
                chunk.prompt_tokens,
                chunk.cached_tokens,
            ) == (None, None, None);
        let Some(Cow::Borrowed(content)) = chunk.first_piece.as_ref().filter(|_| bare) else {
            return None;
        };
        // A borrowed string is a slice of `json`: its body, between its quotes.
        let start = (content.as_ptr() as usize).checked_sub(json.as_ptr() as usize)?;
        let end = start + content.len();
        let bytes = json.as_bytes();
        let quoted =
            start > 0 && bytes.get(start - 1) == Some(&b'"') && bytes.get(end) == Some(&b'"');
        (quoted && start <= MAX_HEAD_BYTES && bytes.len() - end <= MAX_HEAD_BYTES).then(|| {
            let (before, after) = (&bytes[..start], &bytes[end..]);
            EventShape {
                before: before.to_vec(),
                after: after.to_vec(),
                one_line: memchr::memchr(b'\n', before).is_none()
                    && memchr::memchr(b'\n', after).is_none(),
            }
        })
    }

    /// `json` as a chunk, when it is this shape around another string.
    fn read<'a>(&self, json: &'a str) -> Option<Chunk<'a>> {
        self.read_in(Scan::text(json), json.as_bytes())
    }

    /// [`EventShape::read`] of `bytes` read by `scan`: text, or bytes whose string is checked
    /// for UTF-8 as it is read.
    fn read_in<'a>(&self, mut scan: Scan<'a>, bytes: &'a [u8]) -> Option<Chunk<'a>> {
        if !bytes.starts_with(&self.before) {
            return None;
        }
        // The string's body and its closing quote: the second part starts with that quote.
        let content = scan.string_from(self.before.len()).ok()?;
        let rest = &bytes[scan.position() - 1..];
        (rest == self.after.as_slice()).then(|| Chunk {
            any_choice: true,
            answer: Some((Some(0), false)),
            first_piece: Some(content),
            ..Chunk::default()
        })
    }
}

/// The generated fields of a choice, or of the `delta` (streamed) or `message` (whole) inside
/// it: those that are strings, and whether `tool_calls` is a non-empty array. Reasoning comes
/// in `reasoning` from vLLM 0.32 on (with `--reasoning-parser`, and thinking is Qwen3.5's
/// default: a whole answer can be reasoning alone), in `reasoning_content` before.
#[derive(Debug, Default)]
struct Part<'a> {
    reasoning: Option<Cow<'a, str>>,
    reasoning_content: Option<Cow<'a, str>>,
    content: Option<Cow<'a, str>>,
    /// A completion choice's text.
    text: Option<Cow<'a, str>>,
    /// The name and arguments (those that are strings) of each tool called.
    tool_texts: Vec<Cow<'a, str>>,
    calls_tools: bool,
}

/// A choice as read: its own fields, and its `delta` and `message` (`None` when absent,
/// `Some(None)` when not an object).
#[derive(Debug, Default)]
struct Choice<'a> {
    own: Part<'a>,
    delta: Option<Option<Part<'a>>>,
    message: Option<Option<Part<'a>>>,
}

/// The fields of one object read so far, to refuse a duplicate as serde's derive does.
#[derive(Default)]
struct Seen(u8);

impl Seen {
    /// Marks field `bit`; a second time is malformed.
    fn first(&mut self, bit: u8) -> scan::Read<()> {
        let mask = 1 << bit;
        if self.0 & mask != 0 {
            return Err(scan::Malformed);
        }
        self.0 |= mask;
        Ok(())
    }
}

impl<'a> Chunk<'a> {
    /// Reads `json` (a whole answer), borrowing its strings.
    pub fn parse(json: &'a [u8]) -> Self {
        Self::read_all(Scan::new(json))
    }

    /// [`Chunk::parse`] of text (an event's [`data`]): its strings are not checked for UTF-8
    /// again.
    pub fn parse_text(json: &'a str) -> Self {
        Self::read_all(Scan::text(json))
    }

    /// [`Chunk::parse_text`] of one event of a stream whose earlier events `seen` has seen:
    /// when this one begins with the same head, those bytes are not read again. Each event of
    /// a vLLM stream repeats its `id`, `object`, `created` and `model` before `choices`, 8 of
    /// an event's 13 strings. The chunk is the same either way: up to the end of the head,
    /// the same bytes leave the reading in the same place, having read nothing.
    ///
    /// Most events of a stream differ from the one before only in the text they carry: when
    /// this one is made of the same bytes as the last event whose only text was its content,
    /// around another string in that content's place, it is read as that string alone (the
    /// same chunk as read whole: the bytes before the string leave the reading in the same
    /// place, the string changes nothing but the text, and the same bytes after it read alike).
    pub fn parse_event(json: &'a str, seen: &mut EventHead) -> Self {
        if let Some(chunk) = seen.shape.as_ref().and_then(|shape| shape.read(json)) {
            return chunk;
        }
        let chunk = Self::parse_after_head(json, &mut seen.head);
        if let Some(shape) = EventShape::of(json, &chunk) {
            seen.shape = Some(shape);
        }
        chunk
    }

    /// [`Chunk::parse_event`] of an SSE event's bytes, when its one `data:` line is the shape
    /// `seen` learnt around another string; `None` when the event must be read from its
    /// [`data`]. The event is not checked for UTF-8 first: the shape's two parts were read as
    /// text, and the string between them is checked as it is read, so the event is UTF-8
    /// whenever this reads it, its `data` is that line, and `parse_event` reads the same chunk
    /// from it (the tests compare them). A 200-event stream's events are each read this way
    /// after the first few.
    pub fn parse_shaped_sse_event(event: &'a [u8], seen: &EventHead) -> Option<Self> {
        let shape = seen.shape.as_ref().filter(|shape| shape.one_line)?;
        // What `data` takes of the usual event, in its order: no `\n` is left in the line, as
        // the two parts hold none and a string's body holds no control character.
        let line = event.strip_suffix(b"\n\n")?.strip_prefix(b"data:")?;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = line.strip_prefix(b" ").unwrap_or(line);
        shape.read_in(Scan::new(line), line)
    }

    /// [`Chunk::parse_event`] with the head alone.
    fn parse_after_head(json: &'a str, head: &mut Vec<u8>) -> Self {
        let mut scan = Scan::text(json);
        if !head.is_empty() && json.as_bytes().starts_with(head) {
            let from = head.len();
            return Self::read(&mut scan, Some(from))
                .and_then(|(chunk, _)| scan.end().map(|()| chunk))
                .unwrap_or_default();
        }
        let Ok((chunk, end)) = Self::read_whole(&mut scan) else {
            return Self::default();
        };
        if let Some(end) = end.filter(|&end| end <= MAX_HEAD_BYTES) {
            head.clear();
            head.extend_from_slice(&json.as_bytes()[..end]);
        }
        chunk
    }

    /// The whole text as a chunk, or an empty chunk.
    fn read_all(mut scan: Scan<'a>) -> Self {
        Self::read_whole(&mut scan)
            .map(|(chunk, _)| chunk)
            .unwrap_or_default()
    }

    /// The whole text as a chunk, with where its head ends.
    fn read_whole(scan: &mut Scan<'a>) -> scan::Read<(Self, Option<usize>)> {
        if scan.kind()? != Kind::Object {
            return Err(scan::Malformed);
        }
        let read = Self::read(scan, None)?;
        scan.end()?;
        Ok(read)
    }

    /// Reads the chunk's object: from its start, or resumed `from` a key's start. Returns it
    /// with where its head ends: the start of its first field read, when fields passed over
    /// come before it.
    fn read(scan: &mut Scan<'a>, from: Option<usize>) -> scan::Read<(Self, Option<usize>)> {
        let mut chunk = Self::default();
        let mut seen = Seen::default();
        let (mut passed, mut head_end) = (false, None);
        let field = |scan: &mut Scan<'a>, key: &[u8]| {
            if !matches!(key, b"choices" | b"usage") {
                passed |= seen.0 == 0;
                return scan.pass();
            }
            if seen.0 == 0 && passed {
                head_end = Some(scan.key_start());
            }
            chunk.read_field(scan, key, &mut seen)
        };
        match from {
            None => scan.object(field)?,
            Some(at) => scan.object_from(at, field)?,
        }
        Ok((chunk, head_end))
    }

    /// `choices` or `usage`.
    fn read_field(&mut self, scan: &mut Scan<'a>, key: &[u8], seen: &mut Seen) -> scan::Read<()> {
        let chunk = self;
        match key {
            b"choices" => {
                seen.first(0)?;
                let choices = |scan: &mut Scan<'a>| {
                    scan.array(|scan| {
                        let first = !chunk.any_choice;
                        chunk.any_choice = true;
                        let part = scan
                            .loose(Kind::Object, |scan| Ok(Choice::read(scan)?.generated()))?
                            .flatten();
                        if first {
                            // The first choice's pieces come first: its content follows its
                            // reasoning.
                            chunk.answer = Some(part.as_ref().map_or((None, false), |p| {
                                let at = usize::from(p.reasoning.is_some())
                                    + usize::from(p.reasoning_content.is_some());
                                (p.content.is_some().then_some(at), p.calls_tools)
                            }));
                        }
                        if let Some(part) = part {
                            chunk.take_pieces(part);
                        }
                        Ok(())
                    })
                };
                scan.loose(Kind::Array, choices).map(drop)
            }
            b"usage" => {
                seen.first(1)?;
                let usage = |scan: &mut Scan<'a>| {
                    let mut usage = Seen::default();
                    scan.object(|scan, key| match key {
                        b"completion_tokens" => {
                            usage.first(0)?;
                            chunk.completion_tokens = count(scan)?;
                            Ok(())
                        }
                        b"prompt_tokens" => {
                            usage.first(1)?;
                            chunk.prompt_tokens = count(scan)?;
                            Ok(())
                        }
                        b"prompt_tokens_details" => {
                            usage.first(2)?;
                            let details = |scan: &mut Scan<'a>| {
                                let mut details = Seen::default();
                                scan.object(|scan, key| match key {
                                    b"cached_tokens" => {
                                        details.first(0)?;
                                        chunk.cached_tokens = count(scan)?;
                                        Ok(())
                                    }
                                    _ => scan.pass(),
                                })
                            };
                            scan.loose(Kind::Object, details).map(drop)
                        }
                        _ => scan.pass(),
                    })
                };
                scan.loose(Kind::Object, usage).map(drop)
            }
            _ => scan.pass(),
        }
    }

    /// `usage.prompt_tokens`.
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.prompt_tokens
    }

    /// `usage.prompt_tokens_details.cached_tokens`.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.cached_tokens
    }

    fn push_piece(&mut self, piece: Cow<'a, str>) {
        if self.first_piece.is_none() {
            self.first_piece = Some(piece);
        } else {
            self.more_pieces.push(piece);
        }
    }

    /// Adds a choice's generated text: its reasoning, content, completion text, and the name
    /// and arguments of each tool it calls.
    fn take_pieces(&mut self, part: Part<'a>) {
        for piece in [
            part.reasoning,
            part.reasoning_content,
            part.content,
            part.text,
        ]
        .into_iter()
        .flatten()
        .chain(part.tool_texts)
        {
            self.push_piece(piece);
        }
    }

    /// `usage.completion_tokens`.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.completion_tokens
    }

    /// The chunk has no choices and carries usage (vLLM's `include_usage` chunk).
    pub fn usage_only(&self) -> bool {
        self.completion_tokens.is_some() && !self.any_choice
    }

    /// The generated text of every choice, piece by piece: its reasoning, content, completion
    /// text, and the name and arguments of each tool it calls.
    pub fn generated(&self) -> impl Iterator<Item = &str> {
        self.first_piece
            .iter()
            .chain(&self.more_pieces)
            .map(Cow::as_ref)
    }

    /// The first choice's answer: its content (reasoning left out) and whether it calls tools;
    /// `None` when there is no choice.
    pub fn answer(&self) -> Option<(&str, bool)> {
        let (content, calls_tools) = self.answer?;
        let content = content
            .and_then(|at| self.generated().nth(at))
            .unwrap_or("");
        Some((content, calls_tools))
    }
}

/// A token count: a whole number that fits a `u64`, else none.
fn count(scan: &mut Scan<'_>) -> scan::Read<Option<u64>> {
    Ok(match scan.loose(Kind::Number, Scan::number)? {
        Some(scan::Number::U64(n)) => Some(n),
        Some(scan::Number::Other) | None => None,
    })
}

impl<'a> Choice<'a> {
    /// Reads a choice object (or a `delta` or `message`, which are read alike).
    fn read(scan: &mut Scan<'a>) -> scan::Read<Self> {
        let mut choice = Self::default();
        let mut seen = Seen::default();
        scan.object(|scan, key| {
            let (bit, text) = match key {
                b"delta" | b"message" => {
                    let (bit, nested) = match key {
                        b"delta" => (0, &mut choice.delta),
                        _ => (1, &mut choice.message),
                    };
                    seen.first(bit)?;
                    *nested = Some(scan.loose(Kind::Object, |scan| Ok(Self::read(scan)?.own))?);
                    return Ok(());
                }
                b"reasoning" => (6, &mut choice.own.reasoning),
                b"reasoning_content" => (2, &mut choice.own.reasoning_content),
                b"content" => (3, &mut choice.own.content),
                b"text" => (4, &mut choice.own.text),
                b"tool_calls" => {
                    seen.first(5)?;
                    return scan
                        .loose(Kind::Array, |scan| {
                            Self::read_tool_calls(scan, &mut choice.own)
                        })
                        .map(drop);
                }
                _ => return scan.pass(),
            };
            seen.first(bit)?;
            *text = scan.loose(Kind::String, Scan::string)?;
            Ok(())
        })?;
        Ok(choice)
    }

    /// `tool_calls` (an array): each call's `function.name` and `function.arguments`.
    fn read_tool_calls(scan: &mut Scan<'a>, part: &mut Part<'a>) -> scan::Read<()> {
        scan.array(|scan| {
            part.calls_tools = true;
            let call = |scan: &mut Scan<'a>| {
                let mut call = Seen::default();
                scan.object(|scan, key| {
                    if key != b"function" {
                        return scan.pass();
                    }
                    call.first(0)?;
                    let function = |scan: &mut Scan<'a>| {
                        let (mut function, mut texts) = (Seen::default(), [None, None]);
                        scan.object(|scan, key| {
                            let at = match key {
                                b"name" => 0,
                                b"arguments" => 1,
                                _ => return scan.pass(),
                            };
                            function.first(at)?;
                            texts[usize::from(at)] = scan.loose(Kind::String, Scan::string)?;
                            Ok(())
                        })?;
                        part.tool_texts.extend(texts.into_iter().flatten());
                        Ok(())
                    };
                    scan.loose(Kind::Object, function).map(drop)
                })
            };
            scan.loose(Kind::Object, call).map(drop)
        })
    }

    /// Where the choice's generated fields are: its `delta` or `message` when it has one, else
    /// itself (a completion choice). `None` when that `delta` or `message` is not an object.
    fn generated(self) -> Option<Part<'a>> {
        match (self.delta, self.message) {
            (None, None) => Some(self.own),
            (None, Some(nested)) | (Some(nested), _) => nested,
        }
    }
}

/// Reads `json` as a `T` read from a JSON object (see [`object_shape`]), borrowing its strings;
/// anything that is not a JSON object reads as `T::default()`.
pub(crate) fn read_object<'a, T: Shape<'a> + Default>(json: &'a [u8]) -> T {
    object_or_default(serde_json::from_slice(json))
}

/// [`read_object`] of text: serde_json reads a `&str` without checking each string's UTF-8.
pub(crate) fn read_text<'a, T: Shape<'a> + Default>(json: &'a str) -> T {
    object_or_default(serde_json::from_str(json))
}

fn object_or_default<T: Default>(read: serde_json::Result<Loose<T>>) -> T {
    match read {
        Ok(Loose::Is(v)) => v,
        _ => T::default(),
    }
}

/// A JSON value read as `T` when it has `T`'s shape and skipped otherwise, so that one odd
/// field does not lose the whole chunk (its usage included).
#[derive(Debug, Default)]
pub(crate) enum Loose<T> {
    #[default]
    Absent,
    /// Present with another shape (`null` included).
    Other,
    /// Present with `T`'s shape.
    Is(T),
}

impl<T> Loose<T> {
    /// The value, when it has `T`'s shape.
    pub(crate) fn get(&self) -> Option<&T> {
        match self {
            Loose::Is(v) => Some(v),
            Loose::Absent | Loose::Other => None,
        }
    }
}

/// The JSON shape a [`Loose`] value is read as. Each method takes one shape; the defaults skip
/// it.
pub(crate) trait Shape<'de>: Sized {
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Self::from_str(s)
    }

    fn from_str(_: &str) -> Option<Self> {
        None
    }

    fn from_u64(_: u64) -> Option<Self> {
        None
    }

    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        IgnoredAny.visit_map(map).map(|_| None)
    }

    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| None)
    }
}

impl<'de: 'a, 'a> Shape<'de> for Cow<'a, str> {
    fn from_borrowed_str(s: &'de str) -> Option<Self> {
        Some(Cow::Borrowed(s))
    }

    fn from_str(s: &str) -> Option<Self> {
        Some(Cow::Owned(s.to_owned()))
    }
}

impl Shape<'_> for u64 {
    fn from_u64(n: u64) -> Option<Self> {
        Some(n)
    }
}

impl<'de, T: Shape<'de>> Shape<'de> for Box<T> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        Ok(T::from_map(map)?.map(Box::new))
    }
}

impl<'de, T: Shape<'de>> Shape<'de> for Vec<Loose<T>> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Some(items))
    }
}

/// A serde-derived struct read from a JSON object: the `Shape::from_map` of every struct
/// [`object_shape!`] names.
pub(crate) fn object_from_map<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
    map: A,
) -> Result<Option<T>, A::Error> {
    T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
}

/// The structs named (serde-derived, with and without a borrowed lifetime) are read from JSON
/// objects: the structs above, and MindIE's in `api::mindie`.
macro_rules! object_shape {
    ($($t:ident<$a:lifetime>),* ; $($plain:ident),*) => {
        $(impl<'de: $a, $a> $crate::api::sse::Shape<'de> for $t<$a> {
            fn from_map<A: ::serde::de::MapAccess<'de>>(
                map: A,
            ) -> Result<Option<Self>, A::Error> {
                $crate::api::sse::object_from_map(map)
            }
        })*
        $(impl<'de> $crate::api::sse::Shape<'de> for $plain {
            fn from_map<A: ::serde::de::MapAccess<'de>>(
                map: A,
            ) -> Result<Option<Self>, A::Error> {
                $crate::api::sse::object_from_map(map)
            }
        })*
    };
}
pub(crate) use object_shape;

impl<'de, T: Shape<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LooseVisitor(PhantomData))
    }
}

struct LooseVisitor<T>(PhantomData<T>);

impl<T> LooseVisitor<T> {
    fn read(value: Option<T>) -> Loose<T> {
        value.map_or(Loose::Other, Loose::Is)
    }
}

impl<'de, T: Shape<'de>> Visitor<'de> for LooseVisitor<T> {
    type Value = Loose<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Self::read(T::from_u64(n)))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Self::read(T::from_borrowed_str(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Self::read(T::from_str(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Ok(Self::read(T::from_seq(seq)?))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Ok(Self::read(T::from_map(map)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reading [`Chunk`] replaced: serde's derive over [`Loose`] fields. Every text must
    /// read the same both ways.
    mod reference {
        use super::super::{read_object, read_text, Loose};
        use serde::Deserialize;
        use std::borrow::Cow;

        /// An OpenAI completion or chat completion, whole or one chunk of a stream, as far as metering
        /// reads it. A field of an unexpected type is ignored, as if absent; anything that is not a
        /// JSON object (a stream's `[DONE]` included) reads as an empty chunk.
        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        pub struct Chunk<'a> {
            #[serde(borrow)]
            choices: Loose<Vec<Loose<Choice<'a>>>>,
            usage: Loose<Usage>,
        }

        /// A choice, or the `delta` (streamed) or `message` (whole) inside it.
        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Choice<'a> {
            #[serde(borrow)]
            delta: Loose<Box<Choice<'a>>>,
            #[serde(borrow)]
            message: Loose<Box<Choice<'a>>>,
            #[serde(borrow)]
            reasoning: Loose<Cow<'a, str>>,
            #[serde(borrow)]
            reasoning_content: Loose<Cow<'a, str>>,
            #[serde(borrow)]
            content: Loose<Cow<'a, str>>,
            /// A completion choice's text.
            #[serde(borrow)]
            text: Loose<Cow<'a, str>>,
            #[serde(borrow)]
            tool_calls: Loose<Vec<Loose<ToolCall<'a>>>>,
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct ToolCall<'a> {
            #[serde(borrow)]
            function: Loose<Function<'a>>,
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Function<'a> {
            #[serde(borrow)]
            name: Loose<Cow<'a, str>>,
            #[serde(borrow)]
            arguments: Loose<Cow<'a, str>>,
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Usage {
            completion_tokens: Loose<u64>,
            prompt_tokens: Loose<u64>,
            prompt_tokens_details: Loose<Details>,
        }

        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Details {
            cached_tokens: Loose<u64>,
        }

        impl<'a> Chunk<'a> {
            /// Reads `json` (a whole answer), borrowing its strings.
            pub fn parse(json: &'a [u8]) -> Self {
                read_object(json)
            }

            /// [`Chunk::parse`] of text (an event's [`data`]): its strings are not checked for UTF-8
            /// again.
            pub fn parse_text(json: &'a str) -> Self {
                read_text(json)
            }

            /// `usage.completion_tokens`.
            pub fn completion_tokens(&self) -> Option<u64> {
                self.usage.get()?.completion_tokens.get().copied()
            }

            /// `usage.prompt_tokens`.
            pub fn prompt_tokens(&self) -> Option<u64> {
                self.usage.get()?.prompt_tokens.get().copied()
            }

            /// `usage.prompt_tokens_details.cached_tokens`.
            pub fn cached_tokens(&self) -> Option<u64> {
                let details = self.usage.get()?.prompt_tokens_details.get()?;
                details.cached_tokens.get().copied()
            }

            /// The chunk has no choices and carries usage (vLLM's `include_usage` chunk).
            pub fn usage_only(&self) -> bool {
                self.completion_tokens().is_some() && self.choices.get().is_none_or(Vec::is_empty)
            }

            /// The generated text of every choice, piece by piece: its reasoning, content, completion
            /// text, and the name and arguments of each tool it calls.
            pub fn generated(&self) -> impl Iterator<Item = &str> {
                self.choices
                    .get()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get()?.generated())
                    .flat_map(|part| {
                        let calls = part.tool_calls.get().into_iter().flatten();
                        let functions = calls.filter_map(|c| c.get()?.function.get());
                        let texts = [
                            &part.reasoning,
                            &part.reasoning_content,
                            &part.content,
                            &part.text,
                        ];
                        texts
                            .into_iter()
                            .chain(functions.flat_map(|f| [&f.name, &f.arguments]))
                    })
                    .filter_map(|s| s.get().map(Cow::as_ref))
            }

            /// The first choice's answer: its content (reasoning left out) and whether it calls tools;
            /// `None` when there is no choice.
            pub fn answer(&self) -> Option<(&str, bool)> {
                let first = self.choices.get()?.first()?;
                let Some(part) = first.get().and_then(Choice::generated) else {
                    return Some(("", false));
                };
                let content = part.content.get().map_or("", Cow::as_ref);
                let calls_tools = part.tool_calls.get().is_some_and(|c| !c.is_empty());
                Some((content, calls_tools))
            }
        }

        impl Choice<'_> {
            /// Where the choice's generated fields are: its `delta` or `message` when it has one, else
            /// itself (a completion choice). `None` when that `delta` or `message` is not an object.
            fn generated(&self) -> Option<&Self> {
                match (&self.delta, &self.message) {
                    (Loose::Absent, Loose::Absent) => Some(self),
                    (Loose::Absent, nested) | (nested, _) => nested.get().map(Box::as_ref),
                }
            }
        }

        crate::api::sse::object_shape!(Chunk<'a>, Choice<'a>, ToolCall<'a>, Function<'a>; Usage, Details);
    }

    /// A JSON object from its entries, with `ws` around its tokens.
    fn object(entries: Vec<(String, String)>, ws: &str) -> String {
        let fields: Vec<String> = entries
            .into_iter()
            .map(|(k, v)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    /// Any JSON value, odd ones and now and then a malformed one included.
    fn any_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            50 => string(),
            50 => prop::sample::select(vec![
                "0", "7", "196", "-1", "-0", "1.5", "2e3", "18446744073709551615",
                "18446744073709551616", "true", "false", "null",
            ])
            .prop_map(str::to_string),
            1 => malformed(),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((key(), inner), 0..4).prop_map(|e| object(e, "")),
            ]
        })
    }

    /// A JSON string: plain, escaped, with surrogates paired and now and then not.
    fn string() -> impl Strategy<Value = String> {
        prop_oneof![
            60 => prop::sample::select(vec![
                r#""x""#, r#""""#, r#"" t001""#, r#""a\"b\/""#, r#""\u00e9\n""#,
                r#""\ud83d\ude00""#, "\"\u{e9}\u{4e2d}\"", r#""\u0001""#,
            ])
            .prop_map(str::to_string),
            1 => prop::sample::select(vec![r#""\ud800""#, r#""\udc00""#, r#""\ud800\u0041""#])
                .prop_map(str::to_string),
        ]
    }

    /// What serde_json refuses, or reads only when it passes it over: a control character in
    /// a string, a bad escape, numbers with bad grammar or out of range, a cut literal.
    fn malformed() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "\"\x01\"",
            r#""\x""#,
            r#""\u12g4""#,
            "1e400",
            "01",
            "1.",
            "tru",
        ])
        .prop_map(str::to_string)
    }

    /// A key: mostly one no reader reads, now and then one of the fields read (one of them
    /// escaped) or a lone surrogate.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            20 => prop::sample::select(vec!["index", "id", "x", "model", "object", "logprobs"]),
            3 => prop::sample::select(vec![
                "choices", "usage", "delta", "message", "content", "reasoning",
                "reasoning_content", "text", "tool_calls", "function", "name", "arguments",
                "completion_tokens", "prompt_tokens", "prompt_tokens_details", "cached_tokens",
                r"c\u006fntent",
            ]),
            1 => Just(r"\ud800"),
        ]
        .prop_map(str::to_string)
    }

    /// An object with some of `fields`, a field of another name or two, perhaps one twice, in
    /// any order.
    fn fields_of(
        fields: Vec<(&'static str, BoxedStrategy<String>)>,
    ) -> impl Strategy<Value = String> {
        let chosen: Vec<_> = fields
            .into_iter()
            .map(|(k, v)| prop::option::weighted(0.7, v.prop_map(move |v| (k.to_string(), v))))
            .collect();
        (
            chosen,
            prop::collection::vec((key(), any_value()), 0..2),
            prop::bool::weighted(0.03),
            prop::sample::select(vec!["", " ", "\n\t"]),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(chosen, mut extra, twice, ws, at)| {
                let mut entries: Vec<_> = chosen.into_iter().flatten().collect();
                if twice && !entries.is_empty() {
                    entries.push(entries[at.index(entries.len())].clone());
                }
                entries.append(&mut extra);
                if !entries.is_empty() {
                    let by = at.index(entries.len());
                    entries.rotate_left(by);
                }
                object(entries, ws)
            })
    }

    /// A value of the shape metering reads, or now and then any value in its place.
    fn shaped(s: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop_oneof![4 => s, 1 => any_value()].boxed()
    }

    fn text() -> BoxedStrategy<String> {
        shaped(string().boxed())
    }

    fn part(depth: u32) -> BoxedStrategy<String> {
        let function = fields_of(vec![("name", text()), ("arguments", text())]).boxed();
        let call = shaped(fields_of(vec![("function", shaped(function))]).boxed());
        let calls = shaped(
            prop::collection::vec(call, 0..3)
                .prop_map(|c| format!("[{}]", c.join(",")))
                .boxed(),
        );
        let mut fields = vec![
            ("reasoning", text()),
            ("reasoning_content", text()),
            ("content", text()),
            ("text", text()),
            ("tool_calls", calls),
        ];
        if depth > 0 {
            fields.push(("delta", part(depth - 1)));
            fields.push(("message", part(depth - 1)));
        }
        shaped(fields_of(fields).boxed())
    }

    fn chunk_text() -> impl Strategy<Value = String> {
        let choices = shaped(
            prop::collection::vec(part(2), 0..3)
                .prop_map(|c| format!("[{}]", c.join(",")))
                .boxed(),
        );
        let count = shaped(
            prop::sample::select(vec!["0", "9", "196", "-1", "1.5", "18446744073709551616"])
                .prop_map(str::to_string)
                .boxed(),
        );
        let details = shaped(fields_of(vec![("cached_tokens", count.clone())]).boxed());
        let usage = shaped(
            fields_of(vec![
                ("completion_tokens", count.clone()),
                ("prompt_tokens", count),
                ("prompt_tokens_details", details),
            ])
            .boxed(),
        );
        fields_of(vec![("choices", choices), ("usage", usage)])
    }

    /// What metering reads from a chunk (this module's or the reference's): its count,
    /// whether it is usage only, its pieces of text and its answer.
    macro_rules! metered {
        ($chunk:expr) => {{
            let c = $chunk;
            let answer = c.answer().map(|(a, tools)| (a.to_string(), tools));
            let pieces: Vec<String> = c.generated().map(str::to_string).collect();
            let counts = (c.completion_tokens(), c.prompt_tokens(), c.cached_tokens());
            (counts, c.usage_only(), pieces, answer)
        }};
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn reads_every_text_as_the_serde_derived_reading_does(
            json in chunk_text(),
            cut in any::<prop::sample::Index>(),
            edit in prop::option::weighted(0.2, (0..3u8, prop::sample::select(b"\"\\,:}]{[ 0\x01\xff".to_vec()))),
        ) {
            let mut bytes = json.into_bytes();
            match edit {
                Some((0, _)) => bytes.truncate(cut.index(bytes.len() + 1)),
                Some((1, b)) => bytes.insert(cut.index(bytes.len() + 1), b),
                Some((_, b)) if !bytes.is_empty() => {
                    let at = cut.index(bytes.len());
                    bytes[at] = b;
                }
                _ => {}
            }
            let ours = metered!(Chunk::parse(&bytes));
            prop_assert_eq!(&ours, &metered!(reference::Chunk::parse(&bytes)));
            if let Ok(text) = std::str::from_utf8(&bytes) {
                prop_assert_eq!(&metered!(Chunk::parse_text(text)), &ours);
                prop_assert_eq!(&metered!(reference::Chunk::parse_text(text)), &ours);
            }
        }
    }

    /// An event of a stream: `head` (members no reader reads, each followed by its comma), then
    /// the members of `chunk` (an object's text).
    fn with_head(head: &str, chunk: &str) -> String {
        format!("{{{head}{}", chunk.strip_prefix('{').unwrap_or(chunk))
    }

    fn head() -> impl Strategy<Value = String> {
        let member = (
            prop::sample::select(vec!["id", "object", "created", "model", "x"]),
            any_value(),
            prop::sample::select(vec!["", " "]),
        );
        prop::collection::vec(member, 1..4).prop_map(|members| {
            members
                .into_iter()
                .map(|(k, v, ws)| format!("{ws}\"{k}\":{ws}{v},"))
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn a_streams_events_read_with_their_head_remembered_read_as_each_alone(
            heads in prop::collection::vec(head(), 1..3),
            events in prop::collection::vec((any::<prop::sample::Index>(), chunk_text()), 1..6),
            edit in prop::option::weighted(0.2, (any::<prop::sample::Index>(), any::<prop::sample::Index>(), prop::sample::select(b"\"\\,:}]{[ 0".to_vec()))),
        ) {
            let mut memo = EventHead::default();
            for (i, (which, chunk)) in events.iter().enumerate() {
                let mut text = with_head(&heads[which.index(heads.len())], chunk);
                if let Some((event, at, b)) = edit {
                    if event.index(events.len()) == i && !text.is_empty() {
                        let at = at.index(text.len());
                        if text.is_char_boundary(at) && text.is_char_boundary(at + 1) {
                            text.replace_range(at..at + 1, &char::from(b).to_string());
                        }
                    }
                }
                let alone = metered!(Chunk::parse_text(&text));
                prop_assert_eq!(&metered!(Chunk::parse_event(&text, &mut memo)), &alone);
            }
        }
    }

    #[test]
    fn a_head_is_remembered_once_read_whole_and_skipped_after() {
        let head = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","#;
        let event = |content: &str| {
            format!(r#"{head}"choices":[{{"index":0,"delta":{{"content":"{content}"}}}}]}}"#)
        };
        let mut memo = EventHead::default();
        let first = event("a");
        assert_eq!(
            Chunk::parse_event(&first, &mut memo).answer(),
            Some(("a", false))
        );
        assert_eq!(memo.head, head.as_bytes());
        // The next event is read from its `choices` on: a head it did not repeat would not be.
        let second = event("b");
        assert_eq!(
            Chunk::parse_event(&second, &mut memo).answer(),
            Some(("b", false))
        );
        assert_eq!(memo.head, head.as_bytes());
        // An event with another head is read whole, and its head is the one kept.
        let other = r#"{"id":"c2","choices":[],"usage":{"completion_tokens":2}}"#;
        let read = Chunk::parse_event(other, &mut memo);
        assert_eq!(
            (read.usage_only(), read.completion_tokens()),
            (true, Some(2))
        );
        assert_eq!(memo.head, br#"{"id":"c2","#);
        // Nothing before the first field read: no head.
        let mut none = EventHead::default();
        Chunk::parse_event(r#"{"choices":[],"id":"c3"}"#, &mut none);
        assert!(none.head.is_empty());
    }

    /// A content string's body: plain text, escapes good and bad, a quote or a control
    /// character that ends or breaks it.
    fn content_body() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "a",
            " ",
            "\u{e9}",
            r#"\n"#,
            r#"\""#,
            r#"\u00e9"#,
            r#"\ud83d\ude00"#,
            r#"\ud800"#,
            r#"\x"#,
            "\"",
            "\u{1}",
            "\\",
            "\"},",
            "}",
        ]);
        prop::collection::vec(piece, 0..6).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn a_streams_events_of_one_shape_read_as_each_alone(
            events in prop::collection::vec((0..3usize, content_body(), 0..6usize), 1..8),
        ) {
            let head = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":"#;
            let deltas = [r#"{"content":""#, r#"{"role":"assistant","content":""#, r#"{"reasoning":"r","content":""#];
            let tails = [
                r#""},"logprobs":null,"finish_reason":null}]}"#,
                r#""},"finish_reason":"stop"}],"usage":{"completion_tokens":3,"prompt_tokens":1}}"#,
                r#""}}]} x"#,
                r#""},"content":"again"}]}"#,
                // As long as the first: only their bytes tell them apart.
                r#"","reasoning":"rrrrrrrrrrrrrrrrrrrrrr"}}]}"#,
                r#""}}],"usage":{"completion_tokens":123456}}"#,
            ];
            prop_assert!(tails[4..].iter().all(|t| t.len() == tails[0].len()));
            let mut memo = EventHead::default();
            for (delta, body, tail) in &events {
                let text = format!("{head}{}{body}{}", deltas[*delta], tails[*tail]);
                let alone = metered!(Chunk::parse_text(&text));
                prop_assert_eq!(&metered!(Chunk::parse_event(&text, &mut memo)), &alone);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn an_events_data_reads_as_its_lines_do(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "data:", "data: ", " ", "x", "\r", "\n", "\r\n", ": c", "id: 1",
            ]), 0..8),
            end in prop::sample::select(vec!["\n\n", "\r\n\r\n", "\r\n\n", "\n", ""]),
        ) {
            let text = format!("{}{end}", pieces.concat());
            prop_assert_eq!(data(text.as_bytes()), data_lines(&text));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn an_event_read_by_its_shape_reads_as_its_data_does(
            first in (0..2usize, 0..3usize),
            events in prop::collection::vec(
                (0..4usize, content_body(), prop::option::of((any::<prop::sample::Index>(), 0..3usize)), 0..3usize, 0..5usize),
                1..6,
            ),
        ) {
            let head = r#"{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":""#;
            // The last tail has a newline: the first's, learnt from an event of two lines.
            let tails = [r#""},"finish_reason":null}]}"#, r#""}}],"usage":{"completion_tokens":2}}"#, "\"},\n\"finish_reason\":null}]}"];
            let prefixes = ["data: ", "data:", "data:  ", "id: 1\ndata: "];
            let ends = ["\n\n", "\r\n\n", "\r\n\r\n", "\n", "\n\n\n"];
            let mut memo = EventHead::default();
            // The shape is learnt from an event read from its data, on one line or two (whose
            // shape holds a newline, and reads no event's bytes).
            let learnt = match first {
                (0, tail) => format!("data: {head}a{}\n\n", tails[tail]),
                _ => format!("data: {head}a\"}},\ndata: \"finish_reason\":null}}]}}\n\n"),
            };
            Chunk::parse_event(&data(learnt.as_bytes()), &mut memo);
            for (prefix, body, bad, tail, end) in &events {
                let mut event = format!("{}{head}", prefixes[*prefix]).into_bytes();
                let mut body = body.clone().into_bytes();
                if let Some((at, byte)) = bad {
                    // A byte that is not UTF-8 there, or a raw newline.
                    body.insert(at.index(body.len() + 1), [0xff, 0xc3, b'\n'][*byte]);
                }
                event.extend_from_slice(&body);
                event.extend_from_slice(format!("{}{}", tails[*tail], ends[*end]).as_bytes());
                let shaped = Chunk::parse_shaped_sse_event(&event, &memo).map(|c| metered!(c));
                // As the meter reads it: by the shape, else from its data.
                let payload = data(&event);
                let read = metered!(Chunk::parse_event(&payload, &mut memo));
                if let Some(shaped) = shaped {
                    prop_assert_eq!(&shaped, &read);
                    prop_assert_eq!(&shaped, &metered!(Chunk::parse_text(&payload)));
                }
            }
        }
    }

    #[test]
    fn the_usual_event_is_read_by_its_shape_and_no_other() {
        let event = |content: &[u8], end: &str| {
            let mut e = br#"data: {"id":"c1","choices":[{"index":0,"delta":{"content":""#.to_vec();
            e.extend_from_slice(content);
            e.extend_from_slice(br#""},"finish_reason":null}]}"#);
            e.extend_from_slice(end.as_bytes());
            e
        };
        let mut memo = EventHead::default();
        // Nothing learnt yet: read from its data.
        assert!(Chunk::parse_shaped_sse_event(&event(b"a", "\n\n"), &memo).is_none());
        Chunk::parse_event(&data(&event(b"a", "\n\n")), &mut memo);
        let second = event(br"b\u00e9", "\r\n\n");
        let read = Chunk::parse_shaped_sse_event(&second, &memo).expect("the shape learnt");
        assert_eq!(read.answer(), Some(("b\u{e9}", false)));
        // Not UTF-8: its data is empty, and it is not read by the shape.
        assert_eq!(data(&event(b"\xff", "\n\n")), "");
        assert!(Chunk::parse_shaped_sse_event(&event(b"\xff", "\n\n"), &memo).is_none());
        // Not the end of an event, or a second line: read from its data.
        assert!(Chunk::parse_shaped_sse_event(&event(b"c", "\n"), &memo).is_none());
        assert!(Chunk::parse_shaped_sse_event(&event(b"c\n", "\n\n"), &memo).is_none());
    }

    #[test]
    fn an_events_shape_is_remembered_and_only_its_string_read_after() {
        let event = |content: &str, finish: &str| {
            format!(
                r#"{{"id":"c1","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":{finish}}}]}}"#
            )
        };
        let mut memo = EventHead::default();
        let first = event("a", "null");
        Chunk::parse_event(&first, &mut memo);
        let shape = memo.shape.as_ref().expect("learned");
        assert_eq!(
            shape.before,
            br#"{"id":"c1","choices":[{"index":0,"delta":{"content":""#
        );
        assert_eq!(shape.after, br#""},"finish_reason":null}]}"#);
        // Read by the shape: the same answer as read whole, escapes decoded.
        let second = event(r"b\u00e9", "null");
        let read = shape.read(&second).expect("the same shape");
        assert_eq!(read.answer(), Some(("b\u{e9}", false)));
        assert_eq!(metered!(read), metered!(Chunk::parse_text(&second)));
        // Another tail, or a string that is not one, is not the shape.
        assert!(shape.read(&event("c", r#""stop""#)).is_none());
        assert!(shape.read(&event(r"\x", "null")).is_none());
        // An event that carries usage, or whose content has escapes, teaches no shape.
        for other in [
            r#"{"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":1}}"#,
            r#"{"choices":[{"delta":{"content":"\n"}}]}"#,
        ] {
            let mut fresh = EventHead::default();
            Chunk::parse_event(other, &mut fresh);
            assert!(fresh.shape.is_none(), "{other}");
        }
    }

    #[test]
    fn text_reads_as_its_bytes_do() {
        for json in [
            r#"{"choices":[{"delta":{"content":"h\u00e9 é"}}],"usage":{"completion_tokens":2}}"#,
            r#"{"choices":[{"index":0,"text":"once"}]}"#,
            "[DONE]",
        ] {
            let (bytes, text) = (Chunk::parse(json.as_bytes()), Chunk::parse_text(json));
            assert_eq!(bytes.completion_tokens(), text.completion_tokens());
            assert_eq!(bytes.answer(), text.answer());
            assert_eq!(
                bytes.generated().collect::<Vec<_>>(),
                text.generated().collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn splits_events_across_pushes() {
        let mut s = SseSplitter::new(1 << 20);
        assert_eq!(
            s.push(Bytes::from_static(b"data: {\"a\"")),
            Split::default()
        );
        let split = s.push(Bytes::from_static(b":1}\n\ndata: [DONE]\n\n"));
        assert_eq!(
            split.events,
            vec![
                Bytes::from("data: {\"a\":1}\n\n"),
                Bytes::from("data: [DONE]\n\n")
            ]
        );
        assert!(!split.too_large);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn an_end_split_across_pushes_is_found_and_nothing_is_searched_twice() {
        let mut s = SseSplitter::new(1 << 20);
        assert_eq!(
            s.push(Bytes::from_static(b"data: a\r\n\r")),
            Split::default()
        );
        assert_eq!(s.searched, 10, "the whole unfinished event was searched");
        let split = s.push(Bytes::from_static(b"\ndata: b\n"));
        assert_eq!(split.events, vec![Bytes::from("data: a\r\n\r\n")]);
        assert_eq!(s.searched, 8, "the next event, searched once");
        let split = s.push(Bytes::from_static(b"\ndata: c\r\n\n"));
        // "\r\n\n" ends with "\n\n": an end too.
        assert_eq!(
            split.events,
            vec![Bytes::from("data: b\n\n"), Bytes::from("data: c\r\n\n")]
        );
        assert_eq!(s.push(Bytes::from_static(b"data: d\r\n")), Split::default());
        assert_eq!(s.finish(), Some(Bytes::from("data: d\r\n")));
    }

    #[test]
    fn nul_framed_events_end_at_their_nul_across_pushes_and_bounded() {
        let mut s = SseSplitter::framed(1 << 20, Framing::Nul);
        assert_eq!(
            s.push(Bytes::from_static(b"{\"text\":[\"a\"]}\0{\"text\":")),
            Split {
                events: vec![Bytes::from("{\"text\":[\"a\"]}\0")],
                run: Some(Bytes::from("{\"text\":[\"a\"]}\0")),
                too_large: false,
            }
        );
        // A blank line is not an end here.
        let split = s.push(Bytes::from_static(b"[\"\\n\\n\"]}\n\n\0"));
        assert_eq!(
            split.events,
            vec![Bytes::from("{\"text\":[\"\\n\\n\"]}\n\n\0")]
        );
        assert_eq!(
            payload(Framing::Nul, &split.events[0]),
            "{\"text\":[\"\\n\\n\"]}\n\n"
        );
        assert_eq!(s.push(Bytes::from_static(b"{\"te")), Split::default());
        assert_eq!(s.finish(), Some(Bytes::from("{\"te")));
        let mut s = SseSplitter::framed(4, Framing::Nul);
        assert_eq!(
            s.push(Bytes::from_static(b"abc\0abcde")),
            Split {
                events: vec![Bytes::from("abc\0")],
                run: Some(Bytes::from("abc\0")),
                too_large: true,
            }
        );
        assert_eq!(payload(Framing::Nul, b"\xff\0"), "");
        assert_eq!(payload(Framing::Sse, b"data: x\n\n"), "x");
    }

    #[test]
    fn an_event_over_the_bound_ends_the_split_after_the_events_before_it() {
        // Each push here begins with an empty buffer: its events are one slice of it.
        let split = |events: Vec<Bytes>, too_large: bool| Split {
            run: (!events.is_empty()).then(|| Bytes::from(events.concat())),
            events,
            too_large,
        };
        // "data: 12345\n\n" is 13 bytes: the bound.
        let ok = Bytes::from("data: 12345\n\n");
        // Complete but one byte over, behind an event that fits: that one still comes out.
        let mut s = SseSplitter::new(13);
        let pushed = s.push(Bytes::from_static(
            b"data: 12345\n\ndata: 123456\n\ndata: 1\n\n",
        ));
        assert_eq!(pushed, split(vec![ok.clone()], true));
        assert_eq!(
            s.push(Bytes::from_static(b"data: 1\n\n")),
            split(vec![], true)
        );
        assert_eq!(s.finish(), None);
        // Unfinished and growing past the bound, a few bytes at a time: the buffer never
        // holds more than the bound plus one push.
        let mut s = SseSplitter::new(13);
        assert_eq!(
            s.push(Bytes::from_static(b"data: 12345\n\ndata: 12")),
            split(vec![ok], false)
        );
        assert_eq!(s.push(Bytes::from_static(b"345678")), split(vec![], true));
        assert_eq!(s.finish(), None);
    }

    /// The events a splitter framed as `framing` makes of `bytes` pushed in pieces cut at
    /// `cuts`, and what is left unfinished.
    fn split_at(
        framing: Framing,
        bytes: &[u8],
        cuts: &[prop::sample::Index],
    ) -> (Vec<Bytes>, Option<Bytes>) {
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut s = SseSplitter::framed(1 << 20, framing);
        let (mut events, mut start) = (Vec::new(), 0);
        for end in at.into_iter().chain([bytes.len()]) {
            let split = s.push(Bytes::copy_from_slice(&bytes[start..end]));
            assert!(!split.too_large);
            if let Some(run) = &split.run {
                assert_eq!(run, &split.events.concat(), "the run is the events");
            }
            events.extend(split.events);
            start = end;
        }
        (events, s.finish())
    }

    /// The events of `bytes` by the definition: each ends at the earliest `\n\n` or
    /// `\r\n\r\n` from its start, searched afresh.
    fn events_by_definition(mut bytes: &[u8]) -> (Vec<Bytes>, Option<Bytes>) {
        let find = |b: &[u8], pat: &[u8]| b.windows(pat.len()).position(|w| w == pat);
        let mut events = Vec::new();
        loop {
            let lf = find(bytes, b"\n\n").map(|p| p + 2);
            let crlf = find(bytes, b"\r\n\r\n").map(|p| p + 4);
            let Some(end) = [lf, crlf].into_iter().flatten().min() else {
                let rest = (!bytes.is_empty()).then(|| Bytes::copy_from_slice(bytes));
                return (events, rest);
            };
            events.push(Bytes::copy_from_slice(&bytes[..end]));
            bytes = &bytes[end..];
        }
    }

    proptest! {
        #[test]
        fn cuts_lines_as_str_lines_does(
            parts in prop::collection::vec(
                prop::sample::select(vec!["\n", "\r", "\r\n", "data: x", "data:", " ", "é"]),
                0..40,
            ),
        ) {
            let text = parts.concat();
            prop_assert_eq!(lines(&text).collect::<Vec<_>>(), text.lines().collect::<Vec<_>>());
        }

        #[test]
        fn splits_as_the_definition_however_the_stream_is_cut(
            parts in prop::collection::vec(
                prop::sample::select(vec!["\n", "\r", "\r\n", "data: x", ": c", "\n\n", "é"]),
                0..40,
            ),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let bytes = parts.concat().into_bytes();
            let split = split_at(Framing::Sse, &bytes, &cuts);
            prop_assert_eq!(split, events_by_definition(&bytes));
        }

        #[test]
        fn splits_nul_framed_events_at_each_nul_however_the_stream_is_cut(
            parts in prop::collection::vec(
                prop::sample::select(vec!["\0", "\n\n", "{\"text\":[\"x\"]}", "é", "\r\n\r\n"]),
                0..40,
            ),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let bytes = parts.concat().into_bytes();
            let split = split_at(Framing::Nul, &bytes, &cuts);
            // By the definition: every event ends just after a NUL, the rest is unfinished.
            let ends = (bytes.iter().enumerate()).filter(|(_, &b)| b == 0).map(|(p, _)| p + 1);
            let mut expected = Vec::new();
            let mut from = 0;
            for end in ends {
                expected.push(Bytes::copy_from_slice(&bytes[from..end]));
                from = end;
            }
            let rest = (from < bytes.len()).then(|| Bytes::copy_from_slice(&bytes[from..]));
            prop_assert_eq!(split, (expected, rest));
        }
    }

    #[test]
    fn data_joins_the_data_lines_and_borrows_a_single_one() {
        let one = data(b"event: x\r\ndata: {\"a\":1}\r\n\r\n");
        assert!(matches!(one, Cow::Borrowed("{\"a\":1}")), "{one:?}");
        assert_eq!(data(b": hi\ndata:{\"a\":\ndata:  1}\n\n"), "{\"a\":\n 1}");
        assert_eq!(data(b"data: [DONE]\n\n"), "[DONE]");
        assert_eq!(data(b"data:  x\r\n\n"), " x");
        assert_eq!(data(b"data: \r\n\n"), "");
        assert_eq!(data(b": only a comment\n\n"), "");
        assert_eq!(data(b"data: \xff\n\n"), "");
    }

    /// vLLM's usage with `--enable-prompt-tokens-details`; without it `prompt_tokens_details`
    /// is `null`.
    #[test]
    fn reads_the_prompt_count_and_its_cached_part() {
        let u = Chunk::parse(
            br#"{"choices":[],"usage":{"prompt_tokens":17,"total_tokens":33,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":16}}}"#,
        );
        let counts = (u.prompt_tokens(), u.cached_tokens(), u.completion_tokens());
        assert_eq!(counts, (Some(17), Some(16), Some(16)));
        let plain = Chunk::parse(
            br#"{"usage":{"prompt_tokens":17,"completion_tokens":1,"prompt_tokens_details":null}}"#,
        );
        assert_eq!(
            (plain.prompt_tokens(), plain.cached_tokens()),
            (Some(17), None)
        );
    }

    #[test]
    fn reads_usage_and_text() {
        let c = Chunk::parse(br#"{"choices":[{"delta":{"content":"hi"}}]}"#);
        let text: Vec<&str> = c.generated().collect();
        assert_eq!((text, c.usage_only()), (vec!["hi"], false));
        let u =
            Chunk::parse(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}"#);
        assert_eq!((u.usage_only(), u.completion_tokens()), (true, Some(9)));
        let done = Chunk::parse(b"[DONE]");
        assert_eq!((done.completion_tokens(), done.answer()), (None, None));
    }

    /// vLLM 0.32 with `--reasoning-parser qwen3` streams thinking in `delta.reasoning` (each
    /// event one token, `content` absent) and answers whole with `message.reasoning` and
    /// `content: null`: all of it is generated text.
    #[test]
    fn reads_reasoning_as_vllm_0_32_sends_it() {
        let event = Chunk::parse(
            br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":" hm"},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert_eq!(event.generated().collect::<Vec<_>>(), vec![" hm"]);
        assert_eq!(event.answer(), Some(("", false)));
        let whole = Chunk::parse(
            br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning":"a b","tool_calls":[]},"finish_reason":"length"}]}"#,
        );
        assert_eq!(whole.generated().collect::<String>(), "a b");
        let both = Chunk::parse(
            br#"{"choices":[{"delta":{"reasoning":"r","reasoning_content":"rc","content":"ok"}}]}"#,
        );
        assert_eq!(both.generated().collect::<Vec<_>>(), vec!["r", "rc", "ok"]);
        assert_eq!(both.answer(), Some(("ok", false)));
    }

    #[test]
    fn separates_the_answer_from_reasoning_and_tool_calls() {
        let c =
            Chunk::parse(br#"{"choices":[{"delta":{"reasoning_content":"hm","content":"ok"}}]}"#);
        assert_eq!(c.generated().collect::<String>(), "hmok");
        assert_eq!(c.answer(), Some(("ok", false)));
        let t = Chunk::parse(
            br#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#,
        );
        assert_eq!(t.generated().collect::<String>(), "f{}");
        assert_eq!(t.answer(), Some(("", true)));
    }

    #[test]
    fn reads_every_choice_of_whole_answers_and_completions() {
        let chat = Chunk::parse(
            br#"{"choices":[{"message":{"content":"a"}},{"message":{"content":"b"}}],"usage":{"completion_tokens":2}}"#,
        );
        assert_eq!(chat.generated().collect::<String>(), "ab");
        assert_eq!(
            (chat.answer(), chat.usage_only()),
            (Some(("a", false)), false)
        );
        let completion = Chunk::parse(br#"{"choices":[{"index":0,"text":"once"}]}"#);
        assert_eq!(completion.generated().collect::<String>(), "once");
    }

    #[test]
    fn unescapes_strings_and_borrows_the_rest() {
        let c = Chunk::parse(
            br#"{"choices":[{"delta":{"reasoning_content":"plain","content":"a\"b\u00e9\n"}}]}"#,
        );
        let pieces: Vec<&str> = c.generated().collect();
        assert_eq!(pieces, vec!["plain", "a\"b\u{e9}\n"]);
    }

    #[test]
    fn a_field_of_another_type_is_skipped_not_the_chunk() {
        // Odd types next to the usage: the usage still counts, the odd fields read as absent.
        let c = Chunk::parse(
            br#"{"choices":[7,{"delta":{"content":5,"tool_calls":null}}],"usage":{"completion_tokens":9,"x":[1,{"a":null}]}}"#,
        );
        assert_eq!(c.completion_tokens(), Some(9));
        assert_eq!(c.generated().count(), 0);
        assert_eq!(
            c.answer(),
            Some(("", false)),
            "the first choice is not an object"
        );
        // A `delta` that is not an object: nothing is read from the choice around it.
        let d = Chunk::parse(br#"{"choices":[{"delta":null,"text":"t"}]}"#);
        assert_eq!((d.generated().count(), d.answer()), (0, Some(("", false))));
        // No choices array: usage alone.
        let u = Chunk::parse(br#"{"choices":null,"usage":{"completion_tokens":1}}"#);
        assert!(u.usage_only());
        // Counts that are not whole numbers of u64 are not counts.
        for bad in [r#"-1"#, r#"1.5"#, r#""3""#, r#"18446744073709551616"#] {
            let json = format!(r#"{{"usage":{{"completion_tokens":{bad}}}}}"#);
            assert_eq!(
                Chunk::parse(json.as_bytes()).completion_tokens(),
                None,
                "{bad}"
            );
        }
        for not_a_chunk in [&b"5"[..], b"\"x\"", b"[1]", b"{\"usage\":", b""] {
            let c = Chunk::parse(not_a_chunk);
            assert_eq!((c.completion_tokens(), c.answer()), (None, None));
        }
    }
}
