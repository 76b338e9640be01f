//! A strict JSON reader for picking a few fields out of a text and passing over the rest,
//! without building anything: what metering reads from every stream event and whole answer. It
//! also reads a request body whole into a `serde_json::Value` ([`Scan::value`]), in one pass
//! whose strings' plain bytes are passed over a block at a time.
//!
//! It reads as serde_json reads the same text into a serde-derived struct, error for error, so
//! that a reader written with it can be checked against one written with serde (see the
//! proptest in `api::sse`). Two ways of reading a value follow from that:
//!
//! - A value **passed over** (a field nobody reads) is checked for its grammar only, as serde_json
//!   ignores a value: its strings' escapes are checked, not their UTF-8 or their surrogates, and
//!   its numbers are not parsed.
//! - A value **read** (a field of a struct read, of whatever type it turns out to be), and every
//!   key of an object read, is parsed as serde_json parses it: a string is decoded and must be
//!   UTF-8 with paired surrogates, a number must be in range, and each object or array read
//!   counts toward serde_json's limit of 127 nested containers.

use serde_json::{Map, Value};
use std::borrow::Cow;

/// The text is not one JSON value that serde_json would read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

pub(crate) type Read<T> = Result<T, Malformed>;

/// How many containers being read may nest, as serde_json counts them: it refuses the 128th.
const DEPTH: u8 = 128;

/// Whether `b` ends a run of a string's plain bytes: its quote, a backslash, or one of the
/// control characters it may not hold.
fn stops(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// How many bytes [`plain_run`] tests at once in a long run: a block is tested for a stop
/// without a branch per byte, which the compiler turns into vector compares (docs/performance.md,
/// "Long prompts read in one pass", counts what that saves on a 64 KB prompt).
const BLOCK: usize = 64;

/// The length of `bytes`' run of a string's plain bytes: up to its first byte that [`stops`] it,
/// or all of it. A block at a time (the block that holds a stop is searched for it), then what
/// is left of the run eight bytes at a time: most strings of a stream's events are shorter than
/// a block.
fn plain_run(bytes: &[u8]) -> usize {
    let blocks = bytes.chunks_exact(BLOCK);
    let rest = blocks.remainder();
    for (i, block) in blocks.enumerate() {
        if block.iter().fold(false, |any, &b| any | stops(b)) {
            return i * BLOCK + plain_words(block);
        }
    }
    bytes.len() - rest.len() + plain_words(rest)
}

/// [`plain_run`] of a short text, eight bytes at a time, each word tested for the three kinds of
/// byte at once.
fn plain_words(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    for (i, word) in words.enumerate() {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // A byte's high bit is set in each term where it is that kind of byte (and perhaps in
        // bytes after the first that is: only the lowest counts).
        let control = w.wrapping_sub(ONES * 0x20) & !w;
        let quotes = w ^ (ONES * u64::from(b'"'));
        let quote = quotes.wrapping_sub(ONES) & !quotes;
        let slashes = w ^ (ONES * u64::from(b'\\'));
        let backslash = slashes.wrapping_sub(ONES) & !slashes;
        let found = (control | quote | backslash) & HIGH;
        if found != 0 {
            return i * 8 + (found.trailing_zeros() / 8) as usize;
        }
    }
    let done = bytes.len() - tail.len();
    done + tail.iter().take_while(|&&b| !stops(b)).count()
}

/// Decodes the escape whose backslash is just before `at` in `bytes` onto `out`, as serde_json
/// decodes one in a string: one of JSON's, a `\u` escape of a surrogate the first of a pair.
/// Returns where the escape ends.
fn unescape(bytes: &[u8], at: usize, out: &mut String) -> Read<usize> {
    let c = match bytes.get(at).ok_or(Malformed)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let unit = hex_unit(&bytes[at + 1..])?;
            let (code, end) = match unit {
                0xD800..=0xDBFF => {
                    let low = bytes.get(at + 5..at + 7).filter(|&u| u == b"\\u");
                    let low = hex_unit(&bytes[low.map(|_| at + 7).ok_or(Malformed)?..])?;
                    if !(0xDC00..=0xDFFF).contains(&low) {
                        return Err(Malformed);
                    }
                    let high = u32::from(unit) - 0xD800;
                    (0x10000 + (high << 10) + (u32::from(low) - 0xDC00), at + 11)
                }
                0xDC00..=0xDFFF => return Err(Malformed),
                unit => (u32::from(unit), at + 5),
            };
            out.push(char::from_u32(code).ok_or(Malformed)?);
            return Ok(end);
        }
        _ => return Err(Malformed),
    };
    out.push(c);
    Ok(at + 1)
}

/// The UTF-16 unit of the four hex digits `bytes` starts with.
fn hex_unit(bytes: &[u8]) -> Read<u16> {
    let digits = bytes
        .get(..4)
        .filter(|d| d.iter().all(u8::is_ascii_hexdigit));
    let digits = std::str::from_utf8(digits.ok_or(Malformed)?).map_err(|_| Malformed)?;
    u16::from_str_radix(digits, 16).map_err(|_| Malformed)
}

/// A number's text, when it is a non-negative integer that fits a `u64`: its value.
fn plain_u64(text: &[u8]) -> Option<u64> {
    match text.iter().all(u8::is_ascii_digit) {
        true => std::str::from_utf8(text).ok()?.parse().ok(),
        false => None,
    }
}

/// A number as read: a non-negative integer that fits a `u64`, or any other number in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Number {
    U64(u64),
    Other,
}

/// The next value's kind, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Literal,
}

/// A string's body as read: where it lies between its quotes when it has no escapes, else its
/// text decoded.
enum Body {
    Plain(std::ops::Range<usize>),
    Decoded(String),
}

/// A cursor over one JSON text.
pub(crate) struct Scan<'a> {
    bytes: &'a [u8],
    /// The same text, when it is known to be UTF-8: strings are then cut from it unchecked.
    text: Option<&'a str>,
    at: usize,
    /// serde_json's `remaining_depth`.
    depth: u8,
    /// Where the key being read starts.
    key_start: usize,
    /// Whether the key being read has escapes.
    key_escaped: bool,
}

impl<'a> Scan<'a> {
    /// A reader of `bytes`, whose strings are checked for UTF-8 as they are read.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            text: None,
            at: 0,
            depth: DEPTH,
            key_start: 0,
            key_escaped: false,
        }
    }

    /// A reader of `text`.
    pub(crate) fn text(text: &'a str) -> Self {
        Self {
            text: Some(text),
            ..Self::new(text.as_bytes())
        }
    }

    /// The byte after any whitespace, not consumed.
    fn peek(&mut self) -> Read<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Ok(b);
            }
            self.at += 1;
        }
        Err(Malformed)
    }

    fn eat(&mut self, byte: u8) -> Read<()> {
        if self.peek()? != byte {
            return Err(Malformed);
        }
        self.at += 1;
        Ok(())
    }

    /// The kind of the next value.
    pub(crate) fn kind(&mut self) -> Read<Kind> {
        Ok(match self.peek()? {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b'-' | b'0'..=b'9' => Kind::Number,
            b't' | b'f' | b'n' => Kind::Literal,
            _ => return Err(Malformed),
        })
    }

    /// Only whitespace is left.
    pub(crate) fn end(&mut self) -> Read<()> {
        match self.peek() {
            Err(Malformed) => Ok(()),
            Ok(_) => Err(Malformed),
        }
    }

    /// Reads an object (the next value must be one), calling `field` with each key, decoded
    /// (and checked as serde_json checks a key); `field` must read or pass over the value.
    pub(crate) fn object(&mut self, field: impl FnMut(&mut Self, &[u8]) -> Read<()>) -> Read<()> {
        self.enter()?;
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            self.members(field)?;
        }
        self.depth += 1;
        Ok(())
    }

    /// Reads the rest of the outermost object from `at`, where a key starts: as [`Scan::object`]
    /// would have, had it read the bytes before `at` itself (which must be the start of an
    /// object and whole members, each followed by its comma).
    pub(crate) fn object_from(
        &mut self,
        at: usize,
        field: impl FnMut(&mut Self, &[u8]) -> Read<()>,
    ) -> Read<()> {
        self.at = at;
        self.enter()?;
        self.members(field)?;
        self.depth += 1;
        Ok(())
    }

    /// Where the key being read starts (its opening quote), in the object read last.
    pub(crate) fn key_start(&self) -> usize {
        self.key_start
    }

    /// Whether the key being read, in the object read last, has escapes (it was decoded, and
    /// is not the text after [`Scan::key_start`]).
    pub(crate) fn key_escaped(&self) -> bool {
        self.key_escaped
    }

    /// An object's members, up to and through its closing brace.
    fn members(&mut self, mut field: impl FnMut(&mut Self, &[u8]) -> Read<()>) -> Read<()> {
        loop {
            self.peek()?;
            self.key_start = self.at;
            self.eat(b'"')?;
            let key = self.string_body()?;
            self.eat(b':')?;
            self.key_escaped = matches!(key, Body::Decoded(_));
            match key {
                Body::Plain(range) => {
                    let raw = &self.bytes[range];
                    if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
                        return Err(Malformed);
                    }
                    field(self, raw)?;
                }
                Body::Decoded(key) => field(self, key.as_bytes())?,
            }
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// Reads an array (the next value must be one), calling `item` for each element; `item`
    /// must read or pass over it.
    pub(crate) fn array(&mut self, mut item: impl FnMut(&mut Self) -> Read<()>) -> Read<()> {
        self.enter()?;
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
        } else {
            loop {
                item(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(Malformed),
                }
            }
        }
        self.depth += 1;
        Ok(())
    }

    /// One more container read inside the others.
    fn enter(&mut self) -> Read<()> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(Malformed);
        }
        Ok(())
    }

    /// Reads a string (the next value must be one), decoded: borrowed when it has no escapes.
    pub(crate) fn string(&mut self) -> Read<Cow<'a, str>> {
        self.eat(b'"')?;
        let body = self.string_body()?;
        self.text_of(body)
    }

    /// Reads the rest of a string whose body starts at `at` (just after its opening quote),
    /// through its closing quote, as [`Scan::string`] reads the whole string.
    pub(crate) fn string_from(&mut self, at: usize) -> Read<Cow<'a, str>> {
        self.at = at;
        let body = self.string_body()?;
        self.text_of(body)
    }

    /// A string's text, as read.
    fn text_of(&self, body: Body) -> Read<Cow<'a, str>> {
        match body {
            Body::Plain(range) => self.cut(range).map(Cow::Borrowed),
            Body::Decoded(text) => Ok(Cow::Owned(text)),
        }
    }

    /// Where the cursor is: the next byte to read.
    pub(crate) fn position(&self) -> usize {
        self.at
    }

    /// Reads a string's bytes after its opening quote, through its closing one, decoded as
    /// serde_json decodes a string: where it lies when it has no escapes, else each escape
    /// decoded ([`unescape`]) after the plain bytes before it, which are copied, not read one by
    /// one (prompts are written with their newlines and quotes escaped).
    fn string_body(&mut self) -> Read<Body> {
        let bytes = self.bytes;
        let body = self.at;
        let mut decoded = String::new();
        let mut piece = body;
        loop {
            let rest = &bytes[self.at..];
            let stop = plain_run(rest);
            if stop == rest.len() {
                return Err(Malformed);
            }
            self.at += stop + 1;
            match rest[stop] {
                b'"' if piece == body => return Ok(Body::Plain(body..self.at - 1)),
                b'"' => {
                    decoded.push_str(self.cut(piece..self.at - 1)?);
                    return Ok(Body::Decoded(decoded));
                }
                b'\\' => {
                    decoded.push_str(self.cut(piece..self.at - 1)?);
                    self.at = unescape(bytes, self.at, &mut decoded)?;
                    piece = self.at;
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// The text of `range`, which starts and ends at an ASCII byte or an end of the text: cut
    /// from the text when it is known to be UTF-8, else checked.
    fn cut(&self, range: std::ops::Range<usize>) -> Read<&'a str> {
        match self.text {
            Some(text) => text.get(range),
            None => std::str::from_utf8(&self.bytes[range]).ok(),
        }
        .ok_or(Malformed)
    }

    /// Passes over a string (the next value must be one): its body between the quotes, and
    /// whether that has escapes.
    fn raw_string(&mut self) -> Read<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let body = self.at;
        let escaped = self.pass_string_body()?;
        let bytes = self.bytes;
        Ok((&bytes[body..self.at - 1], escaped))
    }

    /// Reads a number (the next value must be one).
    pub(crate) fn number(&mut self) -> Read<Number> {
        let text = self.number_text()?;
        if let Some(n) = plain_u64(text) {
            return Ok(Number::U64(n));
        }
        // Rare: negative, fractional, or past u64. serde_json says whether it is in range.
        serde_json::from_slice::<serde_json::Number>(text)
            .map(|_| Number::Other)
            .map_err(|_| Malformed)
    }

    /// Reads a number (the next value must be one) as serde_json parses it.
    fn number_value(&mut self) -> Read<serde_json::Number> {
        let text = self.number_text()?;
        match plain_u64(text) {
            Some(n) => Ok(n.into()),
            None => serde_json::from_slice(text).map_err(|_| Malformed),
        }
    }

    /// Passes over a number (the next value must be one): its text.
    fn number_text(&mut self) -> Read<&'a [u8]> {
        self.peek()?;
        let start = self.at;
        self.pass_number()?;
        let bytes = self.bytes;
        Ok(&bytes[start..self.at])
    }

    /// Reads the next value whole, as `serde_json::from_str::<Value>` reads it: each object's
    /// members in the order written, a key written twice kept where it first came with its
    /// last value. (serde_json's own reading also takes an object whose first key is its
    /// private raw-value marker for the JSON text in its value; Python, and so this, does not.)
    pub(crate) fn value(&mut self) -> Read<Value> {
        Ok(match self.kind()? {
            Kind::Object => {
                let mut map = Map::new();
                self.object(|scan, key| {
                    let key = std::str::from_utf8(key).map_err(|_| Malformed)?;
                    let value = scan.value()?;
                    map.insert(key.to_owned(), value);
                    Ok(())
                })?;
                Value::Object(map)
            }
            Kind::Array => {
                let mut items = Vec::new();
                self.array(|scan| scan.value().map(|v| items.push(v)))?;
                Value::Array(items)
            }
            Kind::String => Value::String(self.string()?.into_owned()),
            Kind::Number => Value::Number(self.number_value()?),
            Kind::Literal => {
                let first = self.bytes[self.at];
                self.literal()?;
                match first {
                    b't' => Value::Bool(true),
                    b'f' => Value::Bool(false),
                    _ => Value::Null,
                }
            }
        })
    }

    /// Reads the next value with `read` when it is of `kind`, and any other value as
    /// [`Scan::other`], giving `None`: serde's `Loose`, where a field of another type reads as
    /// absent.
    pub(crate) fn loose<T>(
        &mut self,
        kind: Kind,
        read: impl FnOnce(&mut Self) -> Read<T>,
    ) -> Read<Option<T>> {
        if self.kind()? == kind {
            read(self).map(Some)
        } else {
            self.other().map(|()| None)
        }
    }

    /// Reads a value of a shape nobody reads, as serde_json reads a field of the wrong type:
    /// a string or number is parsed, an object's keys are decoded and its values passed over,
    /// an array's elements passed over.
    pub(crate) fn other(&mut self) -> Read<()> {
        match self.kind()? {
            Kind::Object => self.object(|scan, _| scan.pass()),
            Kind::Array => self.array(Self::pass),
            Kind::String => self.string().map(drop),
            Kind::Number => self.number().map(drop),
            Kind::Literal => self.literal(),
        }
    }

    fn literal(&mut self) -> Read<()> {
        let rest = &self.bytes[self.at..];
        let word: &[u8] = match rest.first() {
            Some(b't') => b"true",
            Some(b'f') => b"false",
            _ => b"null",
        };
        if !rest.starts_with(word) {
            return Err(Malformed);
        }
        self.at += word.len();
        Ok(())
    }

    /// Passes over the next value, checking only its grammar (serde_json's `ignore_value`).
    /// Containers are tracked on a stack of their own, not by recursion: a value passed over
    /// may nest as deep as it likes.
    pub(crate) fn pass(&mut self) -> Read<()> {
        // The open containers, innermost last: `true` for an object.
        let mut open: Vec<bool> = Vec::new();
        loop {
            // A value.
            match self.kind()? {
                Kind::Object | Kind::Array => {
                    let object = self.bytes[self.at] == b'{';
                    self.at += 1;
                    let close = if object { b'}' } else { b']' };
                    if self.peek()? == close {
                        self.at += 1;
                    } else {
                        open.push(object);
                        if object {
                            self.pass_key()?;
                        }
                        continue;
                    }
                }
                Kind::String => {
                    self.raw_string()?;
                }
                Kind::Number => self.pass_number()?,
                Kind::Literal => self.literal()?,
            }
            // After a value: the next one in its container, or the container's end.
            loop {
                let Some(&object) = open.last() else {
                    return Ok(());
                };
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        if object {
                            self.pass_key()?;
                        }
                        break;
                    }
                    b'}' if object => self.at += 1,
                    b']' if !object => self.at += 1,
                    _ => return Err(Malformed),
                }
                open.pop();
            }
        }
    }

    /// Passes over an object's key and its colon.
    fn pass_key(&mut self) -> Read<()> {
        self.raw_string()?;
        self.eat(b':')
    }

    /// Passes over a string's bytes after its opening quote, through its closing one: its
    /// escapes must be JSON's and it may hold no control character. Returns whether it has
    /// escapes.
    fn pass_string_body(&mut self) -> Read<bool> {
        let mut escaped = false;
        loop {
            let rest = &self.bytes[self.at..];
            let stop = plain_run(rest);
            if stop == rest.len() {
                return Err(Malformed);
            }
            self.at += stop + 1;
            match rest[stop] {
                b'"' => return Ok(escaped),
                b'\\' => escaped = true,
                _ => return Err(Malformed),
            }
            match self.bytes.get(self.at) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 1,
                Some(b'u') => {
                    let hex = self.bytes.get(self.at + 1..self.at + 5).ok_or(Malformed)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return Err(Malformed);
                    }
                    self.at += 5;
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// Passes over a number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn pass_number(&mut self) -> Read<()> {
        if self.bytes.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.bytes.get(self.at) {
            Some(b'0') => {
                self.at += 1;
                if self.digits() > 0 {
                    return Err(Malformed);
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(Malformed),
        }
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(Malformed);
            }
        }
        if matches!(self.bytes.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.bytes.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(Malformed);
            }
        }
        Ok(())
    }

    /// Passes over ASCII digits; returns how many.
    fn digits(&mut self) -> usize {
        let rest = &self.bytes[self.at..];
        let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        self.at += n;
        n
    }
}

/// Whether a body's text holds more than `most` objects, arrays and strings (keys included),
/// counted without reading the JSON: numbers, booleans and nulls are not counted, and a text
/// that is not JSON is counted as far as it looks like it (it is refused either way). Each
/// counted item takes two bytes at least, so a text of up to twice `most` bytes is not read.
pub(crate) fn holds_more_items_than(text: &[u8], most: u64) -> bool {
    if (text.len() / 2) as u64 <= most {
        return false;
    }
    let mut items = 0u64;
    let mut at = 0;
    while let Some(found) = memchr::memchr3(b'{', b'[', b'"', &text[at..]) {
        at += found + 1;
        items += 1;
        if items > most {
            return true;
        }
        if text[at - 1] == b'"' {
            // To the string's closing quote, past its escapes.
            loop {
                match memchr::memchr2(b'"', b'\\', &text[at..]) {
                    Some(end) if text[at + end] == b'"' => {
                        at += end + 1;
                        break;
                    }
                    Some(escape) => at = (at + escape + 2).min(text.len()),
                    None => return false,
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;

    /// serde_json's verdict on `json` passed over whole.
    fn serde_passes(json: &[u8]) -> bool {
        serde_json::from_slice::<IgnoredAny>(json).is_ok()
    }

    /// The bytes that end a run of a string's plain bytes, by definition: its quote, a
    /// backslash, and the control characters it may not hold.
    static STOP: [bool; 256] = {
        let mut stop = [false; 256];
        let mut b = 0;
        while b < 0x20 {
            stop[b] = true;
            b += 1;
        }
        stop[b'"' as usize] = true;
        stop[b'\\' as usize] = true;
        stop
    };

    fn passes(json: &[u8]) -> bool {
        let mut scan = Scan::new(json);
        scan.pass().and_then(|()| scan.end()).is_ok()
    }

    proptest::proptest! {
        #[test]
        fn a_plain_run_ends_at_the_first_quote_backslash_or_control_character(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    // Runs longer than a block, and stops anywhere in one.
                    60 => 0x20u8..=0xff,
                    1 => proptest::num::u8::ANY,
                    1 => proptest::sample::select(vec![b'"', b'\\', 0x1f, 0x20, 0x7f, 0x80]),
                ],
                0..300,
            ),
        ) {
            let by_definition = bytes.iter().position(|&b| STOP[usize::from(b)]);
            proptest::prop_assert_eq!(plain_run(&bytes), by_definition.unwrap_or(bytes.len()));
        }
    }

    /// Any JSON value (strings of any chars, numbers of every kind serde_json writes), nested a
    /// few levels.
    fn any_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = || proptest::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((text(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// `value` written as clients write JSON, each choice taken from `choices` in turn: any
    /// char of a string or key raw or as a `\u` escape (a surrogate pair past the BMP), the short
    /// escapes and `\/`, whitespace of each kind between tokens; a key may come twice.
    fn written(value: &Value, choices: &mut impl Iterator<Item = u8>, out: &mut String) {
        let space = |choices: &mut dyn Iterator<Item = u8>, out: &mut String| {
            let pick = choices.next().unwrap_or(0);
            out.push_str(
                [" ", "\n", "\t", "\r", " \n  "]
                    .get(usize::from(pick))
                    .unwrap_or(&""),
            );
        };
        let string = |s: &str, choices: &mut dyn Iterator<Item = u8>, out: &mut String| {
            out.push('"');
            for c in s.chars() {
                let escaped = choices.next().unwrap_or(0) % 3 == 0;
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' if escaped => out.push_str("\\n"),
                    '/' if escaped => out.push_str("\\/"),
                    c if (c as u32) < 0x20 || escaped => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
        };
        space(choices, out);
        match value {
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    written(item, choices, out);
                }
                space(choices, out);
                out.push(']');
            }
            Value::Object(members) => {
                out.push('{');
                for (i, (key, item)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    // A key sent twice: first with another value, which the second replaces.
                    if choices.next().unwrap_or(1) == 0 {
                        string(key, choices, out);
                        out.push_str(":0,");
                    }
                    space(choices, out);
                    string(key, choices, out);
                    space(choices, out);
                    out.push(':');
                    written(item, choices, out);
                }
                space(choices, out);
                out.push('}');
            }
            Value::String(s) => string(s, choices, out),
            other => out.push_str(&other.to_string()),
        }
        space(choices, out);
    }

    /// `text` read whole as a value, by [`Scan::value`] and by serde_json.
    fn both_read(text: &str) -> (Option<Value>, Option<Value>) {
        let mut scan = Scan::text(text);
        let ours = scan.value().and_then(|v| scan.end().map(|()| v)).ok();
        (ours, serde_json::from_str::<Value>(text).ok())
    }

    proptest::proptest! {
        #[test]
        fn a_value_reads_as_serde_json_reads_it(
            value in any_value(),
            choices in proptest::collection::vec(0u8..8, 0..400),
        ) {
            let mut text = String::new();
            written(&value, &mut choices.into_iter().cycle(), &mut text);
            let (ours, serde) = both_read(&text);
            proptest::prop_assert!(ours.is_some(), "{}", text);
            // Equal, with every object's members in the same order.
            proptest::prop_assert_eq!(ours.as_ref().map(Value::to_string), serde.as_ref().map(Value::to_string));
            proptest::prop_assert_eq!(ours.as_ref(), Some(&value));
        }

        #[test]
        fn a_changed_text_is_read_or_refused_as_serde_json_reads_or_refuses_it(
            value in any_value(),
            at in proptest::num::usize::ANY,
            byte in proptest::sample::select(b"{}[],:\"\\ 0-.eE+tfnu1\x01\x7f".to_vec()),
            how in 0u8..3,
        ) {
            let mut chars: Vec<char> = value.to_string().chars().collect();
            let (at, byte) = (at % (chars.len() + 1), char::from(byte));
            match how {
                0 => chars.insert(at, byte),
                1 if at < chars.len() => chars[at] = byte,
                _ if at < chars.len() => {
                    chars.remove(at);
                }
                _ => chars.push(byte),
            }
            let text = String::from_iter(chars);
            let (ours, serde) = both_read(&text);
            proptest::prop_assert_eq!(ours, serde, "{}", text);
        }
    }

    #[test]
    fn passes_over_what_serde_json_ignores_and_refuses_the_rest() {
        for json in [
            &br#"{"a":[1,-0.5e+3,true,false,null,"x\u00e9\n",{}],"b":{"c":[[]]}}"#[..],
            b" [ 1 , 2 ] ",
            b"\"\\ud800\"",
            b"\"\xff\"",
            b"0",
            b"{}",
            b"01",
            b"1.",
            b"1e",
            b"-",
            b"[1,]",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{1:2}",
            b"\"a\x01\"",
            b"\"\\x\"",
            b"\"\\u12g4\"",
            b"[1 2]",
            b"[}",
            b"tru",
            b"nul",
            b"[1] x",
            b"",
            b"\"open",
        ] {
            assert_eq!(
                passes(json),
                serde_passes(json),
                "{}",
                String::from_utf8_lossy(json)
            );
        }
    }

    #[test]
    fn passes_over_any_depth_but_reads_up_to_serdes_limit() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(passes(deep(10_000).as_bytes()));
        for (n, ok) in [(127, true), (128, false)] {
            let text = deep(n);
            let mut scan = Scan::new(text.as_bytes());
            fn nest(scan: &mut Scan) -> Read<()> {
                match scan.kind()? {
                    Kind::Array => scan.array(nest),
                    _ => scan.other(),
                }
            }
            assert_eq!(nest(&mut scan).is_ok(), ok, "{n}");
            assert_eq!(serde_json::from_str::<serde_json::Value>(&text).is_ok(), ok);
        }
    }

    #[test]
    fn reads_strings_and_numbers_as_serde_json_parses_them() {
        for json in [
            r#""plain""#,
            r#""a\"b\u00e9\n""#,
            r#""\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\udc00x""#,
            "\"\u{e9}\"",
            r#""\ud800\u0041""#,
            r#""\ud800\n""#,
            r#""\ud800x""#,
            r#""\udbff\udfff\u0000\b\f\r\t\/""#,
            "\"\u{e9}\\u00e9\u{1f600}\\n\u{1f600}\"",
            r#""\\\\\"""#,
        ] {
            let ours = Scan::new(json.as_bytes()).string().ok();
            let serde = serde_json::from_str::<String>(json).ok();
            assert_eq!(ours.as_deref(), serde.as_deref(), "{json}");
        }
        assert!(Scan::new(b"\"\xff\"").string().is_err());
        assert!(Scan::new(b"\"\\n\xff\"").string().is_err());
        for (json, read) in [
            ("0", Ok(Number::U64(0))),
            ("18446744073709551615", Ok(Number::U64(u64::MAX))),
            ("18446744073709551616", Ok(Number::Other)),
            ("-0", Ok(Number::Other)),
            ("-3", Ok(Number::Other)),
            ("1.5", Ok(Number::Other)),
            ("1e400", Err(Malformed)),
        ] {
            assert_eq!(Scan::new(json.as_bytes()).number(), read, "{json}");
        }
    }

    #[test]
    fn items_are_objects_arrays_and_strings_outside_strings() {
        let items = |text: &str| {
            (0..64)
                .find(|&most| !holds_more_items_than(text.as_bytes(), most))
                .unwrap()
        };
        assert_eq!(items(r#"{"a": [1, 2, 3], "b": {"c": null, "d": true}}"#), 7);
        // Quotes, brackets and braces inside strings are text, escaped quotes too.
        assert_eq!(items(r#"{"k": "[{\"x\": \\\"}]", "l": "\\"}"#), 5);
        assert_eq!(
            items(r#"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]"#),
            1
        );
        // An unclosed string counts once; a text that ends in an escape is not read past.
        assert_eq!(items(r#"["abc"#), 2);
        assert_eq!(items("[\"abcdefgh\\"), 2);
        // Short texts are not read: "[][]" may hold 2 items, and its 4 bytes cannot hold 3.
        assert!(!holds_more_items_than(b"[][]", 2));
        assert!(holds_more_items_than(b"[][]", 1));
        let blocks = format!("[{}]", r#"{"type":"text","text":"a"},"#.repeat(1000));
        assert!(holds_more_items_than(blocks.as_bytes(), 5000));
        assert!(!holds_more_items_than(blocks.as_bytes(), 5001));
    }
}
