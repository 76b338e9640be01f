//! Tokenizer room: [`Tokenizer`], the model's tokenizer loaded from a HuggingFace
//! `tokenizer.json`.
//!
//! HuggingFace `tokenizers` is the reference. When the file is a byte-level BPE the fast engine
//! reproduces exactly (byte-level vocabulary with ids dense from 0, `ignore_merges`, NFC or no
//! normalizer, one split regex that needs no look-around but the usual trailing whitespace one,
//! then ByteLevel, plain special added tokens) the tokenizer runs a fast engine built straight
//! from the file (`super::bpe`: the file's merge list over flat tables); otherwise it loads
//! the `tokenizers` object and says why at load.
//!
//! The fast path reads the small sections (normalizer, pre-tokenizer, decoder, post-processor,
//! added tokens) with the `tokenizers` crate's own types, and the vocabulary and merges (the
//! bulk) with a lean borrowed parse, because building the full `tokenizers` object costs more
//! than a second and hundreds of MB that the fast engine would throw away. It reproduces
//! HuggingFace's order of operations: added tokens are matched on the raw text first, each
//! segment between them is NFC-normalized (by HuggingFace's own NFC, only when a quick check
//! says it may not be already; runs of chars below U+0300 are passed over without decoding),
//! then split by the regex (Qwen's matched by hand over ASCII: `super::split`) and BPE-encoded.
//!
//! Counting with a ceiling reads only what it needs: no token is longer than the longest in
//! the vocabulary, so once a segment (or one pre-token) is that many bytes times the tokens
//! left before the ceiling, plus one, the count is past the ceiling without normalizing,
//! splitting or merging the rest; short of that, pre-tokens are counted one by one and the
//! count stops at the first that passes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::ControlFlow;
use std::path::Path;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use anyhow::Context;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, OffsetReferential, OffsetType,
    PostProcessorWrapper, PreTokenizer, PreTokenizerWrapper,
};
use unicode_normalization_alignments::{char::canonical_combining_class, is_nfc_quick};
use unicode_normalization_alignments::{IsNormalized, UnicodeNormalization};

use super::bpe::{Bpe, Work};
use super::byte_level::{bytes_to_string, string_to_bytes};
use super::split::PreTokenSplit;

/// A token count that may have stopped early: counting with a ceiling stops as soon as the
/// count passes it, since the rest of the text cannot change the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCount {
    /// The whole text was counted: exactly this many tokens, at most the ceiling.
    Exact(usize),
    /// Counting stopped once past the ceiling: the text has at least this many tokens, more
    /// than the ceiling.
    AtLeast(usize),
}

impl TokenCount {
    /// The count of a text of `tokens` tokens, against `ceiling`.
    pub fn of(tokens: usize, ceiling: usize) -> TokenCount {
        if tokens > ceiling {
            TokenCount::AtLeast(tokens)
        } else {
            TokenCount::Exact(tokens)
        }
    }

    /// The tokens counted: the exact count, or the lower bound.
    pub fn tokens(self) -> usize {
        match self {
            TokenCount::Exact(n) | TokenCount::AtLeast(n) => n,
        }
    }
}

/// Which engine [`Tokenizer::load_with`] should build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    /// The fast engine when the file is representable exactly, else HuggingFace.
    Auto,
    /// Always HuggingFace `tokenizers` (the reference; for benches and parity tests).
    Hf,
}

/// The engine a loaded [`Tokenizer`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// Byte-level BPE over flat tables, with HuggingFace's added-token and NFC handling.
    Fast,
    /// HuggingFace `tokenizers`, because the fast engine could not be exact (or was not asked for).
    HfFallback {
        /// Why the fast engine is not used.
        reason: String,
    },
}

/// The model's tokenizer: counting, encoding and decoding, with special tokens recognized in
/// the text (as vLLM and MindIE do for prompts).
pub struct Tokenizer {
    engine: Engine,
    imp: Imp,
}

enum Imp {
    Fast(Box<FastEngine>),
    Hf(Box<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("engine", &self.engine)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` at `path`, with the fast engine when it is exact.
    pub fn load(path: &Path) -> anyhow::Result<Tokenizer> {
        Self::load_with(path, EngineChoice::Auto)
    }

    /// Loads the `tokenizer.json` a command was given (`given`, by its option `flag`), else the
    /// Qwen3.5 one found beside the binary ([`crate::util::assets::locate`]).
    pub fn load_default(given: Option<&Path>, flag: &str) -> anyhow::Result<Tokenizer> {
        let path =
            crate::util::assets::locate(given, crate::util::assets::DEFAULT_TOKENIZER, flag)?;
        Self::load(&path)
    }

    /// Loads `tokenizer.json` at `path` with the engine `choice` asks for.
    pub fn load_with(path: &Path, choice: EngineChoice) -> anyhow::Result<Tokenizer> {
        let fast = match choice {
            EngineChoice::Hf => Err("HuggingFace engine requested".to_owned()),
            EngineChoice::Auto => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading tokenizer {}", path.display()))?;
                FastEngine::from_json(&text)
            }
        };
        let tokenizer = match fast {
            Ok(fast) => Tokenizer {
                engine: Engine::Fast,
                imp: Imp::Fast(Box::new(fast)),
            },
            Err(reason) => Tokenizer {
                imp: Imp::Hf(Box::new(load_hf(path)?)),
                engine: Engine::HfFallback { reason },
            },
        };
        match &tokenizer.engine {
            Engine::Fast => tracing::info!(
                path = %path.display(),
                vocab_size = tokenizer.vocab_size(),
                "tokenizer loaded: fast engine (byte-level BPE, exact for this file)"
            ),
            Engine::HfFallback { reason } => tracing::info!(
                path = %path.display(),
                vocab_size = tokenizer.vocab_size(),
                %reason,
                "tokenizer loaded: HuggingFace engine"
            ),
        }
        Ok(tokenizer)
    }

    /// The engine in use.
    pub fn engine(&self) -> Engine {
        self.engine.clone()
    }

    /// Number of tokens in `text`.
    pub fn count(&self, text: &str) -> usize {
        self.count_up_to(text, usize::MAX).tokens()
    }

    /// Number of tokens in `text` if it is at most `ceiling`; otherwise counting stops as soon
    /// as it passes the ceiling, so the work is bounded by the ceiling, not by the text: the
    /// text is split into pre-tokens lazily and the count adds them up one by one.
    pub fn count_up_to(&self, text: &str, ceiling: usize) -> TokenCount {
        let mut counter = Counter { count: 0, ceiling };
        let flow = match &self.imp {
            Imp::Fast(fast) => fast.encode_with(text, &mut Sink::Count(&mut counter)),
            Imp::Hf(hf) => hf_count_with(hf, text, |n| counter.add(n)),
        };
        match flow {
            ControlFlow::Continue(()) => TokenCount::Exact(counter.count),
            ControlFlow::Break(()) => TokenCount::AtLeast(counter.count),
        }
    }

    /// The characters of `text` each of its tokens covers, as HuggingFace's offsets give them
    /// (`encode_char_offsets`; transformers' `return_offsets_mapping`): a token of part of a
    /// character covers the whole character, and a character NFC composes from several covers
    /// the first of them.
    pub fn char_spans(&self, text: &str) -> Vec<(usize, usize)> {
        match &self.imp {
            Imp::Fast(fast) => fast.char_spans(text, usize::MAX),
            Imp::Hf(hf) => match hf.encode_char_offsets(text, false) {
                Ok(encoding) => encoding.get_offsets().to_vec(),
                Err(e) => unreachable!("tokenizers encode failed after a successful load: {e}"),
            },
        }
    }

    /// The first `limit` of [`Tokenizer::char_spans`] (the fast engine merges no pre-token
    /// past them).
    fn char_spans_up_to(&self, text: &str, limit: usize) -> Vec<(usize, usize)> {
        match &self.imp {
            Imp::Fast(fast) => fast.char_spans(text, limit),
            Imp::Hf(_) => {
                let mut spans = self.char_spans(text);
                spans.truncate(limit);
                spans
            }
        }
    }

    /// `text` as vLLM 0.32's score and rerank routes cut a query or a document to at most
    /// `most` tokens (`max_tokens_per_query`, `max_tokens_per_doc`; its
    /// `truncate_text_to_tokens`): while the text has more, it ends where its `most`-th token
    /// ends or where the next one begins, whichever comes first, and at least one character
    /// short of its end ([`Tokenizer::char_spans`]), and is read again. The cut, and its
    /// tokens, which may be fewer than `most` (a character split between two tokens goes whole).
    pub fn cut_to_tokens<'t>(&self, text: &'t str, most: usize) -> (&'t str, usize) {
        if most == 0 {
            return ("", 0);
        }
        let mut text = text;
        while !text.is_empty() {
            let spans = self.char_spans_up_to(text, most + 1);
            if spans.len() <= most {
                return (text, spans.len());
            }
            let chars = text.chars().count();
            let end = spans[most - 1].1.min(spans[most].0).min(chars - 1);
            text = &text[..text.char_indices().nth(end).map_or(text.len(), |(i, _)| i)];
        }
        ("", 0)
    }

    /// Token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.imp {
            Imp::Fast(fast) => {
                let mut out = Vec::new();
                let _ = fast.encode_with(text, &mut Sink::Ids(&mut out));
                out
            }
            Imp::Hf(hf) => hf_encode(hf, text),
        }
    }

    /// Text of `ids`, special tokens included; unknown ids are skipped and invalid UTF-8 is
    /// replaced by U+FFFD (as HuggingFace does).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_within(ids, usize::MAX)
            .expect("no text is longer than usize::MAX bytes")
    }

    /// [`Tokenizer::decode`], or `None` when the text is longer than `max_bytes`: the fast
    /// engine stops as soon as its bytes are past it, so a long answer is never made whole.
    pub fn decode_within(&self, ids: &[u32], max_bytes: usize) -> Option<String> {
        let text = match &self.imp {
            Imp::Fast(fast) => fast.decode(ids, max_bytes)?,
            Imp::Hf(hf) => hf
                .decode(ids, false)
                // A ByteLevel decoder cannot fail; other decoders only on malformed input.
                .unwrap_or_default(),
        };
        (text.len() <= max_bytes).then_some(text)
    }

    /// The token `id` spelled as in the vocabulary (byte-level, e.g. `Ġthe`), or an added
    /// token's text (transformers' `convert_ids_to_tokens`); `None` for an id it does not have.
    pub fn token_str(&self, id: u32) -> Option<String> {
        match &self.imp {
            Imp::Fast(fast) => fast.token_str(id),
            Imp::Hf(hf) => hf.id_to_token(id),
        }
    }

    /// Id of `token`, spelled as in the vocabulary (byte-level, e.g. `Ġthe`) or an added token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.imp {
            Imp::Fast(fast) => fast.token_id(token),
            Imp::Hf(hf) => hf.token_to_id(token),
        }
    }

    /// Number of ids: base vocabulary plus added tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.imp {
            Imp::Fast(fast) => fast.bpe.len() + fast.added_by_content.len(),
            Imp::Hf(hf) => hf.get_vocab_size(true),
        }
    }
}

/// The `tokenizers` object of `path`, with the truncation and padding the file may set cleared,
/// as transformers clears them for every call that does not ask for them (so vLLM never
/// truncates nor pads a prompt by the file's settings).
fn load_hf(path: &Path) -> anyhow::Result<tokenizers::Tokenizer> {
    let mut hf = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", path.display()))?;
    hf.with_truncation(None)
        .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", path.display()))?;
    hf.with_padding(None);
    Ok(hf)
}

/// HuggingFace's encoding pipeline (added tokens, normalizer, pre-tokenizer, model) with the
/// model run one pre-token at a time, handing each one's token count to `add` until it breaks.
/// The same counts as `encode_fast(text, false)`: with special tokens off a post-processor
/// adds none, and truncation and padding are cleared at load.
fn hf_count_with(
    hf: &tokenizers::Tokenizer,
    text: &str,
    mut add: impl FnMut(usize) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let mut pre_tokenized = hf
        .get_added_vocabulary()
        .extract_and_normalize(hf.get_normalizer(), text);
    if let Some(pre) = hf.get_pre_tokenizer() {
        if let Err(e) = pre.pre_tokenize(&mut pre_tokenized) {
            unreachable!("tokenizers pre-tokenizer failed after a successful load: {e}");
        }
    }
    let model = hf.get_model();
    for (piece, _, tokens) in
        pre_tokenized.get_splits(OffsetReferential::Original, OffsetType::None)
    {
        let n = match tokens {
            // An added token, already matched.
            Some(tokens) => tokens.len(),
            None => match model.tokenize(piece) {
                Ok(tokens) => tokens.len(),
                Err(e) => unreachable!("tokenizers model failed after a successful load: {e}"),
            },
        };
        add(n)?;
    }
    ControlFlow::Continue(())
}

fn hf_encode(hf: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    match hf.encode_fast(text, false) {
        Ok(encoding) => encoding.get_ids().to_vec(),
        // Encoding only fails on an invalid tokenizer, which `from_file` already refused.
        Err(e) => unreachable!("tokenizers encode failed after a successful load: {e}"),
    }
}

/// Byte-level BPE over the vocabulary and merges of a representable `tokenizer.json`.
struct FastEngine {
    /// The base vocabulary (ids `0..bpe.len()`) and its merges.
    bpe: Bpe,
    /// Added tokens, matched leftmost-longest on the raw text (as HuggingFace does).
    added: Option<AhoCorasick>,
    /// Id of each `added` pattern.
    added_ids: Vec<u32>,
    added_by_content: HashMap<String, u32>,
    /// Bytes of each added token as HuggingFace's ByteLevel decoder produces them.
    added_bytes: HashMap<u32, Vec<u8>>,
    nfc: bool,
    split: PreTokenSplit,
    /// Bytes of the longest vocabulary token: no token covers more of the text.
    longest: usize,
}

/// The sections of `tokenizer.json` the fast engine reads: small ones with the `tokenizers`
/// types, the vocabulary and merges borrowed from the file text.
#[derive(Deserialize)]
struct TokenizerFile<'a> {
    #[serde(default)]
    added_tokens: Vec<AddedTokenWithId>,
    normalizer: Option<NormalizerWrapper>,
    pre_tokenizer: Option<PreTokenizerWrapper>,
    post_processor: Option<PostProcessorWrapper>,
    decoder: Option<DecoderWrapper>,
    #[serde(borrow)]
    model: ModelFile<'a>,
}

#[derive(Deserialize)]
struct AddedTokenWithId {
    id: u32,
    #[serde(flatten)]
    token: AddedToken,
}

#[derive(Deserialize)]
struct ModelFile<'a> {
    #[serde(rename = "type")]
    kind: Option<Cow<'a, str>>,
    dropout: Option<f32>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    vocab: VocabEntries<'a>,
    #[serde(borrow, default)]
    merges: Vec<MergeEntry<'a>>,
}

/// The `vocab` object as a list (no hashing while parsing).
struct VocabEntries<'a>(Vec<(Cow<'a, str>, u32)>);

impl<'de: 'a, 'a> Deserialize<'de> for VocabEntries<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = VocabEntries<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map from token to id")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((token, id)) = map.next_entry::<Cow<'a, str>, u32>()? {
                    entries.push((token, id));
                }
                Ok(VocabEntries(entries))
            }
        }
        deserializer.deserialize_map(V(std::marker::PhantomData))
    }
}

/// One merge: `["l", "r"]`, or the legacy `"l r"`.
struct MergeEntry<'a>(Cow<'a, str>, Option<Cow<'a, str>>);

impl MergeEntry<'_> {
    fn halves(&self) -> Option<(&str, &str)> {
        match &self.1 {
            Some(r) => Some((&self.0, r)),
            None => self.0.split_once(' '),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for MergeEntry<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = MergeEntry<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a merge: [left, right] or \"left right\"")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                s: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(MergeEntry(Cow::Borrowed(s), None))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MergeEntry(Cow::Owned(s.to_owned()), None))
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
                let l: Cow<'a, str> = seq
                    .next_element()?
                    .ok_or_else(|| serde::de::Error::invalid_length(0, &self))?;
                let r: Cow<'a, str> = seq
                    .next_element()?
                    .ok_or_else(|| serde::de::Error::invalid_length(1, &self))?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(serde::de::Error::invalid_length(3, &self));
                }
                Ok(MergeEntry(l, Some(r)))
            }
        }
        deserializer.deserialize_any(V(std::marker::PhantomData))
    }
}

impl FastEngine {
    /// The fast engine for the `tokenizer.json` text, or why it would not be exact.
    fn from_json(text: &str) -> Result<FastEngine, String> {
        let file: TokenizerFile<'_> = serde_json::from_str(text)
            .map_err(|e| format!("not readable by the fast loader: {e}"))?;
        let model = &file.model;
        if model.kind.as_deref().is_some_and(|k| k != "BPE") {
            return Err("model is not BPE".to_owned());
        }
        check_bpe(model)?;
        let nfc = match &file.normalizer {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return Err("normalizer is neither NFC nor absent".to_owned()),
        };
        let split = PreTokenSplit::new(&split_pattern(file.pre_tokenizer.as_ref())?)?;
        check_decoder_and_post_processor(file.decoder.as_ref(), file.post_processor.as_ref())?;

        // The byte-level base vocabulary, ids dense from 0.
        let n_ranks = model.vocab.0.len();
        let mut ranks: Vec<Option<Vec<u8>>> = vec![None; n_ranks];
        for (token, id) in &model.vocab.0 {
            let bytes = string_to_bytes(token)
                .ok_or_else(|| format!("vocabulary token {token:?} is not byte-level"))?;
            match ranks.get_mut(*id as usize) {
                Some(slot @ None) => *slot = Some(bytes),
                _ => return Err("vocabulary ids are not dense from 0".to_owned()),
            }
        }
        let ranks: Vec<Vec<u8>> = ranks.into_iter().map(Option::unwrap_or_default).collect();
        // HuggingFace's BPE over the file's own merge list, so any merge order is exact.
        let merges = model.merges.iter().enumerate().map(|(index, merge)| {
            merge
                .halves()
                .and_then(|(l, r)| Some((string_to_bytes(l)?, string_to_bytes(r)?)))
                .ok_or_else(|| format!("merge {index} is not a pair of byte-level tokens"))
        });
        let bpe = Bpe::new(&ranks, merges)?;

        let mut added_contents = Vec::new();
        let mut added_ids = Vec::new();
        let mut added_by_content = HashMap::new();
        let mut added_bytes = HashMap::new();
        for AddedTokenWithId { id, token } in &file.added_tokens {
            if !token.special
                || token.normalized
                || token.single_word
                || token.lstrip
                || token.rstrip
            {
                return Err(format!(
                    "added token {:?} is not a plain special token",
                    token.content
                ));
            }
            // As HuggingFace's ByteLevel decoder: byte-level spelling if it is one, else UTF-8.
            let bytes = string_to_bytes(&token.content)
                .unwrap_or_else(|| token.content.as_bytes().to_vec());
            added_bytes.insert(*id, bytes);
            added_by_content.insert(token.content.clone(), *id);
            added_contents.push(token.content.as_str());
            added_ids.push(*id);
        }
        let added = if added_contents.is_empty() {
            None
        } else {
            Some(
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&added_contents)
                    .map_err(|e| format!("added-token matcher: {e}"))?,
            )
        };

        Ok(FastEngine {
            longest: bpe.longest_token().max(1),
            split,
            added,
            added_ids,
            bpe,
            added_by_content,
            added_bytes,
            nfc,
        })
    }

    /// Encodes `text` into `sink` (no allocation for counting) until the end or until `sink`
    /// breaks; the text after that is never normalized, split nor merged.
    fn encode_with(&self, text: &str, sink: &mut Sink<'_>) -> ControlFlow<()> {
        let mut work = Work::default();
        let mut start = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                self.encode_segment(&text[start..m.start()], &mut work, sink)?;
                sink.take(&[self.added_ids[m.pattern().as_usize()]])?;
                start = m.end();
            }
        }
        self.encode_segment(&text[start..], &mut work, sink)
    }

    /// Encodes the text between two added tokens: NFC-normalized (HuggingFace's NFC), split
    /// into pre-tokens, each merged by BPE. Every token is at most `longest` bytes, so text of
    /// `(room + 1) x longest` bytes has more tokens than `sink` has room for: a count stops
    /// there, having normalized and scanned no more than that, and merged nothing of it.
    fn encode_segment(
        &self,
        segment: &str,
        work: &mut Work,
        sink: &mut Sink<'_>,
    ) -> ControlFlow<()> {
        if segment.is_empty() {
            return ControlFlow::Continue(());
        }
        match self.normalize_within(segment, self.past_room(sink)) {
            Ok(text) => self.encode_normalized(&text, work, sink),
            Err(bytes) => sink.pass(bytes.div_ceil(self.longest)),
        }
    }

    /// Bytes of text that hold more tokens than `sink` has room for: `(room + 1) x longest`.
    fn past_room(&self, sink: &Sink<'_>) -> usize {
        sink.room().saturating_add(1).saturating_mul(self.longest)
    }

    /// The segment in NFC if that is shorter than `enough` bytes, else `Err` with a number of
    /// bytes, at least `enough`, that its NFC form has. Reads and normalizes at most about
    /// `enough` bytes either way (a run of combining marks, which NFC reorders as a whole,
    /// aside).
    ///
    /// NFC can cut a text before any char that is in NFC next to anything (quick check yes,
    /// combining class 0, by HuggingFace's Unicode 9 tables): such a char neither composes
    /// with what precedes it nor lets a mark move across it. So the text is copied as it is up
    /// to each char that is not one, and normalized from the last cut before it to the next
    /// cut after it.
    fn normalize_within<'s>(&self, segment: &'s str, enough: usize) -> Result<Cow<'s, str>, usize> {
        if !self.nfc {
            return if segment.len() < enough {
                Ok(Cow::Borrowed(segment))
            } else {
                Err(segment.len())
            };
        }
        // The NFC form is `out` followed by `segment[copied..]` up to the last cut found.
        let bytes = segment.as_bytes();
        let mut out = String::new();
        let mut copied = 0;
        let mut last_cut = 0;
        // `chars` reads `segment` from `offset` on.
        let mut offset = 0;
        let mut chars = segment.char_indices();
        while let Some((k, c)) = chars.next() {
            let i = offset + k;
            if c < '\u{300}' {
                // A run of chars below U+0300 (plainly NFC, so cuts) is passed over without
                // decoding: a char's first byte is 0xCC or more exactly when the char is U+0300
                // or above. The run stops short of the first cut whose length check below would
                // fail (its start at `fails_from` or after), which is then read as any cut.
                let fails_from = enough.saturating_add(copied).saturating_sub(out.len());
                let bound = fails_from.clamp(i, segment.len());
                let mut run_end = bytes[i..bound]
                    .iter()
                    .position(|&b| b >= 0xCC)
                    .map_or(bound, |n| i + n);
                if !segment.is_char_boundary(run_end) {
                    run_end -= 1; // inside a two-byte char: its lead byte is the one before
                }
                if run_end > i {
                    // The run's last char is one byte, or two ending in a continuation byte.
                    last_cut = run_end - if bytes[run_end - 1] < 0x80 { 1 } else { 2 };
                    offset = run_end;
                    chars = segment[run_end..].char_indices();
                    continue;
                }
            }
            if cuts_nfc(c) {
                last_cut = i;
                let known = out.len() + (i - copied);
                if known >= enough {
                    return Err(known);
                }
                continue;
            }
            // Normalize from the last cut up to the next one (or the end), and read on there.
            let next_cut = chars
                .clone()
                .find(|&(_, c)| cuts_nfc(c))
                .map_or(segment.len(), |(j, _)| offset + j);
            out.push_str(&segment[copied..last_cut]);
            out.extend(segment[last_cut..next_cut].nfc().map(|(c, _)| c));
            copied = next_cut;
            last_cut = next_cut;
            offset = next_cut;
            chars = segment[next_cut..].char_indices();
        }
        let known = out.len() + (segment.len() - copied);
        if known >= enough {
            return Err(known);
        }
        if copied == 0 {
            return Ok(Cow::Borrowed(segment));
        }
        out.push_str(&segment[copied..]);
        Ok(Cow::Owned(out))
    }

    fn encode_normalized(
        &self,
        text: &str,
        work: &mut Work,
        sink: &mut Sink<'_>,
    ) -> ControlFlow<()> {
        for piece in self.split.pieces(text) {
            // A pre-token too long for the room left is not merged (that is the costly step).
            if piece.len() >= self.past_room(sink) {
                return sink.pass(piece.len().div_ceil(self.longest));
            }
            let mut flow = ControlFlow::Continue(());
            self.bpe
                .encode_piece(piece, work, &mut |ids| flow = sink.take(ids));
            flow?;
        }
        ControlFlow::Continue(())
    }

    /// The first `limit` of [`Tokenizer::char_spans`]: each segment between added tokens
    /// normalized with the alignment HuggingFace keeps (each char of the NFC form stands for
    /// the original char it replaces; one NFC inserts stands for the original char before it),
    /// its tokens' bytes laid over that form. No pre-token past the `limit`-th token is merged.
    fn char_spans(&self, text: &str, limit: usize) -> Vec<(usize, usize)> {
        let mut spans = Vec::new();
        let mut start = 0;
        let mut chars_before = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                let segment = &text[start..m.start()];
                if self
                    .segment_spans(segment, chars_before, &mut spans, limit)
                    .is_break()
                {
                    return spans;
                }
                chars_before += segment.chars().count();
                let token_chars = text[m.start()..m.end()].chars().count();
                spans.push((chars_before, chars_before + token_chars));
                if spans.len() >= limit {
                    return spans;
                }
                chars_before += token_chars;
                start = m.end();
            }
        }
        let _ = self.segment_spans(&text[start..], chars_before, &mut spans, limit);
        spans
    }

    /// Adds the spans of the tokens of `segment`, which begins at char `base` of the text, to
    /// `spans`; breaks once they are `limit`.
    fn segment_spans(
        &self,
        segment: &str,
        base: usize,
        spans: &mut Vec<(usize, usize)>,
        limit: usize,
    ) -> ControlFlow<()> {
        // The normal form, and (where NFC changed it) the original char each of its chars
        // stands for.
        let (normal, stands_for) =
            match self.nfc && is_nfc_quick(segment.chars()) != IsNormalized::Yes {
                true => {
                    let (mut normal, mut stands_for) = (String::new(), Vec::new());
                    let mut next = 0usize;
                    for (c, change) in segment.nfc() {
                        let replaced = 1 + change.min(0).unsigned_abs();
                        stands_for.push(match change {
                            1.. => next.saturating_sub(1),
                            _ => next,
                        });
                        next += if change > 0 { 0 } else { replaced };
                        normal.push(c);
                    }
                    (Cow::Owned(normal), Some(stands_for))
                }
                false => (Cow::Borrowed(segment), None),
            };
        let original = |k: usize| stands_for.as_ref().map_or(k, |s| s[k]);
        // The chars of the normal form, each as its index and its end byte, read once along
        // the tokens.
        let mut chars =
            (normal.char_indices().enumerate()).map(|(k, (i, c))| (k, i + c.len_utf8()));
        let mut char = chars.next();
        let mut at = 0;
        let mut work = Work::default();
        for piece in self.split.pieces(&normal) {
            let mut ids = Vec::new();
            self.bpe
                .encode_piece(piece, &mut work, &mut |found| ids.extend_from_slice(found));
            for id in ids {
                let len = self.bpe.token_bytes(id).len().max(1);
                while char.is_some_and(|(_, end)| end <= at) {
                    char = chars.next();
                }
                let first = char.map_or(0, |(k, _)| k);
                while char.is_some_and(|(_, end)| end < at + len) {
                    char = chars.next();
                }
                let last = char.map_or(first, |(k, _)| k);
                spans.push((base + original(first), base + original(last) + 1));
                at += len;
                if spans.len() >= limit {
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// The text of `ids`, or `None` once its bytes are past `max_bytes`.
    fn decode(&self, ids: &[u32], max_bytes: usize) -> Option<String> {
        let mut bytes = Vec::with_capacity(ids.len().saturating_mul(4).min(max_bytes));
        for &id in ids {
            // Added tokens first: an added token may reuse a vocabulary id (HF checks it first).
            if let Some(added) = self.added_bytes.get(&id) {
                bytes.extend_from_slice(added);
            } else if (id as usize) < self.bpe.len() {
                bytes.extend_from_slice(self.bpe.token_bytes(id));
            }
            if bytes.len() > max_bytes {
                return None;
            }
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn token_str(&self, id: u32) -> Option<String> {
        if let Some(added) = self.added_bytes.get(&id) {
            return Some(String::from_utf8_lossy(added).into_owned());
        }
        ((id as usize) < self.bpe.len()).then(|| bytes_to_string(self.bpe.token_bytes(id)))
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.added_by_content.get(token) {
            return Some(id);
        }
        self.bpe.token_id(&string_to_bytes(token)?)
    }
}

/// Code points that are in NFC next to anything (NFC_Quick_Check=Yes, canonical combining
/// class 0; a test checks every one against the Unicode tables): ASCII and Latin-1 up to the
/// combining marks, general punctuation from the hyphens to the ellipsis, CJK punctuation,
/// CJK unified ideographs and full-width forms.
const PLAINLY_NFC: &[(char, char)] = &[
    ('\0', '\u{2ff}'),
    ('\u{2010}', '\u{2027}'),
    ('\u{3000}', '\u{3029}'),
    ('\u{4e00}', '\u{9fff}'),
    ('\u{ff01}', '\u{ff60}'),
];

/// Whether `c` is in NFC next to anything (see [`PLAINLY_NFC`]).
fn plainly_nfc_char(c: char) -> bool {
    c < '\u{300}' || PLAINLY_NFC.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// Whether NFC can cut a text right before `c`, by HuggingFace's (Unicode 9) tables: `c` is in
/// NFC next to anything. The plainly NFC ranges first, which need no table.
fn cuts_nfc(c: char) -> bool {
    plainly_nfc_char(c)
        || (is_nfc_quick(std::iter::once(c)) == IsNormalized::Yes
            && canonical_combining_class(c) == 0)
}

/// Where encoding puts what it finds: every id, or a count with a ceiling.
enum Sink<'a> {
    Ids(&'a mut Vec<u32>),
    Count(&'a mut Counter),
}

/// A count that breaks once it passes its ceiling.
struct Counter {
    count: usize,
    ceiling: usize,
}

impl Counter {
    fn add(&mut self, tokens: usize) -> ControlFlow<()> {
        self.count += tokens;
        if self.count > self.ceiling {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

impl Sink<'_> {
    /// Takes the ids of one pre-token or added token; breaks once the answer is known.
    fn take(&mut self, ids: &[u32]) -> ControlFlow<()> {
        match self {
            Sink::Ids(out) => {
                out.extend_from_slice(ids);
                ControlFlow::Continue(())
            }
            Sink::Count(counter) => counter.add(ids.len()),
        }
    }

    /// Tokens it takes before it breaks (no bound for ids).
    fn room(&self) -> usize {
        match self {
            Sink::Ids(_) => usize::MAX,
            Sink::Count(counter) => counter.ceiling.saturating_sub(counter.count),
        }
    }

    /// Takes `tokens`, a lower bound of text left unencoded because it is more than
    /// [`Sink::room`]: a count breaks.
    fn pass(&mut self, tokens: usize) -> ControlFlow<()> {
        match self {
            Sink::Ids(_) => unreachable!("ids have room for any text"),
            Sink::Count(counter) => counter.add(tokens),
        }
    }
}

/// The BPE options that rank-based BPE cannot express.
fn check_bpe(model: &ModelFile<'_>) -> Result<(), String> {
    if model.dropout.is_some() {
        return Err("BPE dropout is set".to_owned());
    }
    if model.byte_fallback {
        return Err("BPE byte_fallback is set".to_owned());
    }
    if model.continuing_subword_prefix.is_some() || model.end_of_word_suffix.is_some() {
        return Err("BPE has a subword prefix or suffix".to_owned());
    }
    if !model.ignore_merges {
        // The fast BPE takes a pre-token that is a whole token as is; HF without ignore_merges
        // may split it.
        return Err("BPE ignore_merges is false".to_owned());
    }
    Ok(())
}

/// The split regex of a `Sequence[Split(regex, Isolated), ByteLevel(no prefix, no regex)]`
/// pre-tokenizer.
fn split_pattern(pre: Option<&PreTokenizerWrapper>) -> Result<String, String> {
    let pre = serde_json::to_value(pre).map_err(|e| e.to_string())?;
    let unsupported = || Err("pre-tokenizer is not Sequence[Split(regex), ByteLevel]".to_owned());
    let Some([split, byte_level]) = pre
        .get("pretokenizers")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    else {
        return unsupported();
    };
    if pre["type"] != "Sequence"
        || split["type"] != "Split"
        || split["behavior"] != "Isolated"
        || split["invert"] != false
        || byte_level["type"] != "ByteLevel"
        || byte_level["add_prefix_space"] != false
        || byte_level["use_regex"] != false
    {
        return unsupported();
    }
    match split["pattern"]["Regex"].as_str() {
        Some(pattern) => Ok(pattern.to_owned()),
        None => unsupported(),
    }
}

fn check_decoder_and_post_processor(
    decoder: Option<&DecoderWrapper>,
    post: Option<&PostProcessorWrapper>,
) -> Result<(), String> {
    if !matches!(decoder, Some(DecoderWrapper::ByteLevel(_))) {
        return Err("decoder is not ByteLevel".to_owned());
    }
    // A ByteLevel post-processor only trims offsets; ids are unchanged.
    if !matches!(post, None | Some(PostProcessorWrapper::ByteLevel(_))) {
        return Err("post-processor adds or changes tokens".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::import::build_tokenizer;
    use crate::tokenize::preset::Preset;
    use serde_json::json;

    const TINY: Preset = Preset {
        name: "tiny",
        pattern: r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        added_tokens: &["<|end|>", "<|endx|>"],
    };

    /// All 256 bytes, then a few merged tokens (ranks 256..).
    fn tiny_ranks() -> Vec<Vec<u8>> {
        let mut ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for t in ["ab", "abc", "bc", " a", "é", "aa", "aaa", "aaaa"] {
            ranks.push(t.as_bytes().to_vec());
        }
        ranks
    }

    /// Writes the tiny tokenizer, edited by `edit`, to a fresh file.
    fn tiny_file(name: &str, edit: impl FnOnce(&mut Value)) -> std::path::PathBuf {
        let hf = build_tokenizer(&tiny_ranks(), &TINY).unwrap();
        let mut json: Value = serde_json::from_str(&hf.to_string(false).unwrap()).unwrap();
        edit(&mut json);
        let dir = std::env::temp_dir().join(format!("tokengate-engine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    /// The tiny tokenizer, edited by `edit`, loaded with the fast engine if it can be.
    fn load_tiny(name: &str, edit: impl FnOnce(&mut Value)) -> Tokenizer {
        Tokenizer::load(&tiny_file(name, edit)).unwrap()
    }

    fn reason(t: &Tokenizer) -> String {
        match t.engine() {
            Engine::Fast => "fast".to_owned(),
            Engine::HfFallback { reason } => reason,
        }
    }

    #[test]
    fn plainly_nfc_code_points_are_nfc_next_to_anything() {
        // By HuggingFace's (Unicode 9) tables, which decide where NFC may cut.
        let mut checked = 0;
        for &(lo, hi) in PLAINLY_NFC {
            for c in lo..=hi {
                assert_eq!(is_nfc_quick(std::iter::once(c)), IsNormalized::Yes, "{c:?}");
                assert_eq!(canonical_combining_class(c), 0, "{c:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 768 + 24 + 42 + 20_992 + 96);
        assert!("Tokens, 令牌。“quoted” — ＡＢ"
            .chars()
            .all(plainly_nfc_char));
        assert!(!plainly_nfc_char('\u{301}'));
        assert!(!plainly_nfc_char('\u{2000}'));
    }

    /// Texts of chars on both sides of U+0300 and of the NFC cuts: ASCII, two-byte Latin
    /// (composed and not), combining marks that compose and reorder, Hangul jamo, CJK.
    fn nfc_texts() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let chars = prop::sample::select(vec![
            'a', 'e', 'q', ' ', '\u{e9}', '\u{ff}', '\u{2ff}', '\u{300}', '\u{301}', '\u{302}',
            '\u{307}', '\u{316}', '\u{323}', '\u{338}', '\u{1100}', '\u{1161}', '\u{11a8}',
            '\u{4e2d}', '\u{212b}', '\u{2026}', '=',
        ]);
        prop::collection::vec(chars, 0..24).prop_map(|v| v.into_iter().collect())
    }

    proptest::proptest! {
        /// `normalize_within` is NFC of the whole while that is shorter than `enough`, and
        /// otherwise the NFC length of the text before the first cut where it reaches `enough`
        /// (or of the whole).
        #[test]
        fn nfc_within_a_bound_stops_at_the_first_cut_past_it(
            text in nfc_texts(),
            enough in 0usize..40,
        ) {
            let tokenizer = crate::tokenize::test_tokenizer();
            let Imp::Fast(fast) = &tokenizer.imp else {
                panic!("Qwen3.5 runs the fast engine");
            };
            let nfc_len = |s: &str| s.nfc().map(|(c, _)| c.len_utf8()).sum::<usize>();
            let whole: String = text.nfc().map(|(c, _)| c).collect();
            let first_past = text
                .char_indices()
                .filter(|&(_, c)| cuts_nfc(c))
                .map(|(i, _)| nfc_len(&text[..i]))
                .find(|&known| known >= enough);
            let expected = match first_past {
                Some(known) => Err(known),
                None if whole.len() >= enough => Err(whole.len()),
                None => Ok(whole),
            };
            proptest::prop_assert_eq!(
                fast.normalize_within(&text, enough).map(Cow::into_owned),
                expected
            );
        }
    }

    #[test]
    fn nfc_by_regions_is_nfc_of_the_whole() {
        let tokenizer = crate::tokenize::test_tokenizer();
        let Imp::Fast(fast) = &tokenizer.imp else {
            panic!("Qwen3.5 runs the fast engine");
        };
        let texts = [
            "plain ascii and 汉字 only",
            "e\u{301}cole cafe\u{301}",
            "\u{1100}\u{1161}\u{11a8} 한국어 \u{1100}\u{1161}",
            "=\u{338} <\u{338}",
            "a\u{323}\u{302} a\u{302}\u{323} q\u{307}\u{323}",
            "\u{301}starts with a mark",
            "ends with a base e",
            "\u{5d0}\u{5b8}\u{5bc} \u{627}\u{644}\u{639}\u{631}\u{628}\u{64a}\u{629}",
            "\u{212b} \u{2126} \u{f900}",
            "x\u{301}\u{301}\u{301}\u{316}\u{316} \u{1e0b}\u{323}",
        ];
        for text in texts {
            let whole: String = text.nfc().map(|(c, _)| c).collect();
            let within = |enough| fast.normalize_within(text, enough).map(Cow::into_owned);
            assert_eq!(within(usize::MAX), Ok(whole.clone()), "{text:?}");
            assert_eq!(within(whole.len() + 1), Ok(whole.clone()), "{text:?}");
            assert_eq!(within(whole.len()), Err(whole.len()), "{text:?}");
        }
        // Text in NFC is not copied.
        assert!(matches!(
            fast.normalize_within("é 汉字", usize::MAX),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn qwen_starts_most_one_character_tokens_whole() {
        let tokenizer = crate::tokenize::test_tokenizer();
        let Imp::Fast(fast) = &tokenizer.imp else {
            panic!("Qwen3.5 runs the fast engine");
        };
        // Of 8,090 one-character tokens outside ASCII (tests/tokenizer_engine.rs), the others
        // are cut by a crossing token, take part in a merge ranked below those that build them,
        // or lie outside the BMP.
        assert_eq!(fast.bpe.whole_characters(), 5_381);
    }

    /// `/tokenize`'s `return_token_strs`: vLLM answers transformers' `convert_ids_to_tokens`,
    /// the vocabulary's byte-level spelling, an added token's text.
    #[test]
    fn token_strings_are_the_vocabulary_spelling() {
        let tokenizer = crate::tokenize::test_tokenizer();
        let ids = tokenizer.encode("Hello world<|im_end|>é");
        let strs: Vec<Option<String>> = ids.iter().map(|&id| tokenizer.token_str(id)).collect();
        let strs: Vec<&str> = strs.iter().map(|s| s.as_deref().unwrap()).collect();
        assert_eq!(strs, ["Hello", "Ġworld", "<|im_end|>", "Ã©"]);
        for &id in &ids {
            assert_eq!(
                tokenizer.token_id(&tokenizer.token_str(id).unwrap()),
                Some(id)
            );
        }
        assert_eq!(tokenizer.token_str(u32::MAX), None);
    }

    #[test]
    fn tokenizer_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn tiny_rank_vocabulary_runs_fast_and_matches_hf() {
        let fast = load_tiny("fast", |_| {});
        assert_eq!(fast.engine(), Engine::Fast);
        assert_eq!(fast.vocab_size(), 266);
        let hf = {
            let hf = build_tokenizer(&tiny_ranks(), &TINY).unwrap();
            Tokenizer {
                engine: Engine::HfFallback {
                    reason: "test".to_owned(),
                },
                imp: Imp::Hf(Box::new(hf)),
            }
        };
        for text in [
            "abc aaaaaaa bcab",
            "<|end|><|endx|><|end",
            "e\u{301} é",
            "aa<|end|>aa",
            "",
        ] {
            assert_eq!(fast.encode(text), hf.encode(text), "{text:?}");
        }
        // leftmost-longest added tokens; "é" composed by NFC before BPE
        assert_eq!(fast.encode("<|endx|>"), vec![265]);
        assert_eq!(fast.encode("e\u{301}"), vec![260]);
        assert_eq!(fast.encode("abc"), vec![257]);
        assert_eq!(fast.token_id("Ġa"), Some(259));
        assert_eq!(fast.token_id("<|end|>"), Some(264));
    }

    #[test]
    fn fast_engine_follows_the_merge_list_of_the_file() {
        // The merges in reverse: longest splits first, so "aaaa" now forms as aaa + a.
        let path = tiny_file("reversed", |j| {
            j["model"]["merges"].as_array_mut().unwrap().reverse()
        });
        let fast = Tokenizer::load(&path).unwrap();
        assert_eq!(fast.engine(), Engine::Fast);
        let hf = Tokenizer::load_with(&path, EngineChoice::Hf).unwrap();
        let original = load_tiny("original", |_| {});
        let text = "aaaaa abcbc aaab abab";
        assert_eq!(fast.encode(text), hf.encode(text));
        assert_ne!(fast.encode(text), original.encode(text));

        // The first merge listed again at the end: HuggingFace keeps the last rank.
        let path = tiny_file("repeated", |j| {
            let merges = j["model"]["merges"].as_array_mut().unwrap();
            merges.push(merges[0].clone());
        });
        let fast = Tokenizer::load(&path).unwrap();
        assert_eq!(fast.engine(), Engine::Fast);
        let hf = Tokenizer::load_with(&path, EngineChoice::Hf).unwrap();
        let text = "abca bcab aab";
        assert_eq!(fast.encode(text), hf.encode(text));
        assert_ne!(fast.encode(text), original.encode(text));
    }

    #[test]
    fn unrepresentable_files_fall_back_to_hf_and_say_why() {
        type Edit = Box<dyn FnOnce(&mut Value)>;
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "ignore-merges",
                Box::new(|j| j["model"]["ignore_merges"] = json!(false)),
                "BPE ignore_merges is false",
            ),
            (
                "normalizer",
                Box::new(|j| j["normalizer"] = json!({"type": "Lowercase"})),
                "normalizer is neither NFC nor absent",
            ),
            (
                "pre-tokenizer",
                Box::new(|j| {
                    j["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": true,
                        "trim_offsets": true, "use_regex": true})
                }),
                "pre-tokenizer is not Sequence[Split(regex), ByteLevel]",
            ),
            (
                "decoder",
                Box::new(|j| j["decoder"] = Value::Null),
                "decoder is not ByteLevel",
            ),
            (
                "look-around",
                Box::new(|j| {
                    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
                        json!(r"\p{L}+(?=\s)|\s+|.")
                }),
                "split regex not supported (only a trailing `\\s+(?!\\S)` may look around): \
                 look-around, including look-ahead and look-behind, is not supported",
            ),
            (
                "empty-match",
                Box::new(|j| {
                    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\p{L}*")
                }),
                "split regex can match the empty string",
            ),
            (
                "added-normalized",
                Box::new(|j| j["added_tokens"][0]["normalized"] = json!(true)),
                "added token \"<|end|>\" is not a plain special token",
            ),
        ];
        for (name, edit, expected) in cases {
            let t = load_tiny(name, edit);
            assert_eq!(reason(&t), expected, "case {name}");
            // the fallback still tokenizes
            assert!(t.count("abc abc") > 0, "case {name}");
        }
        let no_normalizer = load_tiny("no-normalizer", |j| j["normalizer"] = Value::Null);
        // A split without look-around runs as written (no whitespace-tail emulation), and text
        // between matches is a pre-token of its own, as in HuggingFace.
        let path = tiny_file("plain-split", |j| {
            j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\p{L}+|\s")
        });
        let plain_split = Tokenizer::load(&path).unwrap();
        assert_eq!(plain_split.engine(), Engine::Fast);
        let hf = Tokenizer::load_with(&path, EngineChoice::Hf).unwrap();
        for text in ["ab  abc", "12ab!!bc,", "!!", "ab 1", "<|end|>a1"] {
            assert_eq!(plain_split.encode(text), hf.encode(text), "{text:?}");
        }
        assert_eq!(plain_split.encode("ab  abc"), vec![256, 32, 32, 257]);
        assert_eq!(plain_split.encode("1ab1"), vec![49, 256, 49]);
        assert_eq!(no_normalizer.engine(), Engine::Fast);
        assert_eq!(no_normalizer.encode("e\u{301}"), vec![101, 204, 129]);
    }
}
