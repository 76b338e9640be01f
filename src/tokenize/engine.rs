//! Tokenizer room: [`Tokenizer`], the model's tokenizer loaded from a HuggingFace
//! `tokenizer.json`.
//!
//! HuggingFace `tokenizers` is the reference. When the file is representable exactly by a
//! rank-based byte-level BPE (the tiktoken algorithm: byte-level vocabulary with ids as ranks,
//! merges exactly the rank-derived set, `ignore_merges`, NFC or no normalizer, one split regex
//! then ByteLevel, plain special added tokens) the tokenizer runs a fast engine built straight
//! from the file; otherwise it loads the `tokenizers` object and says why at load.
//!
//! The fast path reads the small sections (normalizer, pre-tokenizer, decoder, post-processor,
//! added tokens) with the `tokenizers` crate's own types, and the vocabulary and merges (the
//! bulk) with a lean borrowed parse, because building the full `tokenizers` object costs more
//! than a second and hundreds of MB that the fast engine would throw away. It reproduces
//! HuggingFace's order of operations: added tokens are matched on the raw text first, each
//! segment between them is NFC-normalized (by HuggingFace's own NFC, only when a quick check
//! says it may not be already), then split by the regex and BPE-encoded.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use anyhow::Context;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use tiktoken_rs::CoreBPE;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizedString, Normalizer, NormalizerWrapper,
    PostProcessorWrapper, PreTokenizerWrapper,
};
use unicode_normalization::{is_nfc_quick, IsNormalized};

use super::byte_level::{spells, string_to_bytes};
use super::import::derive_merges;

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
    /// Rank-based byte-level BPE (tiktoken) with HuggingFace's added-token and NFC handling.
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
                imp: Imp::Hf(Box::new(tokenizers::Tokenizer::from_file(path).map_err(
                    |e| anyhow::anyhow!("loading tokenizer {}: {e}", path.display()),
                )?)),
                engine: Engine::HfFallback { reason },
            },
        };
        match &tokenizer.engine {
            Engine::Fast => tracing::info!(
                path = %path.display(),
                vocab_size = tokenizer.vocab_size(),
                "tokenizer loaded: fast engine (rank BPE, exact for this file)"
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
        match &self.imp {
            Imp::Fast(fast) => {
                let mut count = 0;
                fast.encode_with(text, |ids| count += ids.len());
                count
            }
            Imp::Hf(hf) => hf_encode(hf, text).len(),
        }
    }

    /// Token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.imp {
            Imp::Fast(fast) => {
                let mut out = Vec::new();
                fast.encode_with(text, |ids| out.extend_from_slice(ids));
                out
            }
            Imp::Hf(hf) => hf_encode(hf, text),
        }
    }

    /// Text of `ids`, special tokens included; unknown ids are skipped and invalid UTF-8 is
    /// replaced by U+FFFD (as HuggingFace does).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.imp {
            Imp::Fast(fast) => fast.decode(ids),
            Imp::Hf(hf) => hf
                .decode(ids, false)
                // A ByteLevel decoder cannot fail; other decoders only on malformed input.
                .unwrap_or_default(),
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
            Imp::Fast(fast) => fast.vocab_size,
            Imp::Hf(hf) => hf.get_vocab_size(true),
        }
    }
}

fn hf_encode(hf: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    match hf.encode_fast(text, false) {
        Ok(encoding) => encoding.get_ids().to_vec(),
        // Encoding only fails on an invalid tokenizer, which `from_file` already refused.
        Err(e) => unreachable!("tokenizers encode failed after a successful load: {e}"),
    }
}

/// Rank-based byte-level BPE over the vocabulary of a representable `tokenizer.json`.
struct FastEngine {
    bpe: CoreBPE,
    /// Number of base-vocabulary ids (ranks `0..n_ranks`).
    n_ranks: u32,
    /// Added tokens, matched leftmost-longest on the raw text (as HuggingFace does).
    added: Option<AhoCorasick>,
    /// Id of each `added` pattern.
    added_ids: Vec<u32>,
    added_by_content: HashMap<String, u32>,
    /// Bytes of each added token as HuggingFace's ByteLevel decoder produces them.
    added_bytes: HashMap<u32, Vec<u8>>,
    nfc: bool,
    /// The split without its lookahead, when the regex ends in `\s+(?!\S)|\s+` (see
    /// [`WhitespaceSplit`]); `None` lets `CoreBPE` split with the regex as written.
    split: Option<WhitespaceSplit>,
    /// Base-vocabulary ids sorted by their bytes (`token_id` by binary search).
    ids_by_bytes: Vec<u32>,
    vocab_size: usize,
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
        let pattern = split_pattern(file.pre_tokenizer.as_ref())?;
        check_decoder_and_post_processor(file.decoder.as_ref(), file.post_processor.as_ref())?;

        // Ranks: the byte-level vocabulary, ids dense from 0.
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
        check_merges(&model.merges, &ranks)?;

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

        let mut ids_by_bytes: Vec<u32> = (0..n_ranks as u32).collect();
        ids_by_bytes.sort_unstable_by(|&a, &b| ranks[a as usize].cmp(&ranks[b as usize]));
        let encoder = ranks
            .into_iter()
            .enumerate()
            .map(|(rank, bytes)| (bytes, rank as u32))
            .collect();
        let specials = added_by_content
            .iter()
            .map(|(c, &id)| (c.clone(), id))
            .collect();
        let split = WhitespaceSplit::new(&pattern);
        // With our own split, CoreBPE only ever sees single pre-tokens; its regex must then be
        // lookahead-free too (a piece of a million spaces overflows fancy-regex's stack).
        let bpe_pattern = split
            .as_ref()
            .map_or(pattern.as_str(), |s| s.regex.as_str());
        let bpe = CoreBPE::new(encoder, specials, bpe_pattern)
            .map_err(|e| format!("split regex not supported by fancy-regex: {e}"))?;
        Ok(FastEngine {
            split,
            bpe,
            n_ranks: n_ranks as u32,
            added,
            added_ids,
            vocab_size: n_ranks + added_by_content.len(),
            added_by_content,
            added_bytes,
            nfc,
            ids_by_bytes,
        })
    }

    /// Encodes `text`, handing each run of ids to `sink` (no allocation for counting).
    fn encode_with(&self, text: &str, mut sink: impl FnMut(&[u32])) {
        let mut start = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                self.encode_segment(&text[start..m.start()], &mut sink);
                sink(&[self.added_ids[m.pattern().as_usize()]]);
                start = m.end();
            }
        }
        self.encode_segment(&text[start..], &mut sink);
    }

    fn encode_segment(&self, segment: &str, sink: &mut impl FnMut(&[u32])) {
        if segment.is_empty() {
            return;
        }
        if self.nfc && is_nfc_quick(segment.chars()) != IsNormalized::Yes {
            // HuggingFace's own NFC (its Unicode tables), so results match it exactly.
            let mut normalized = NormalizedString::from(segment);
            tokenizers::normalizers::unicode::NFC
                .normalize(&mut normalized)
                .expect("NFC normalization is infallible");
            self.encode_normalized(normalized.get(), sink);
        } else {
            self.encode_normalized(segment, sink);
        }
    }

    fn encode_normalized(&self, text: &str, sink: &mut impl FnMut(&[u32])) {
        match &self.split {
            None => sink(&self.bpe.encode_ordinary(text)),
            Some(split) => {
                for piece in split.pieces(text) {
                    // One pre-token: CoreBPE's lookahead-free regex finds it whole again.
                    sink(&self.bpe.encode_ordinary(piece));
                }
            }
        }
    }

    /// Bytes of base-vocabulary id `rank` (which must be `< n_ranks`).
    fn rank_bytes(&self, rank: u32) -> Vec<u8> {
        self.bpe
            .decode_bytes(&[rank])
            .expect("every rank below n_ranks is in the decoder")
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let mut run = Vec::new();
        for &id in ids {
            // Added tokens first: an added token may reuse a vocabulary id (HF checks it first).
            if let Some(added) = self.added_bytes.get(&id) {
                bytes.extend(self.bpe.decode_bytes(&run).expect("ranks below n_ranks"));
                run.clear();
                bytes.extend_from_slice(added);
            } else if id < self.n_ranks {
                run.push(id);
            }
        }
        bytes.extend(self.bpe.decode_bytes(&run).expect("ranks below n_ranks"));
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.added_by_content.get(token) {
            return Some(id);
        }
        let bytes = string_to_bytes(token)?;
        self.ids_by_bytes
            .binary_search_by(|&id| self.rank_bytes(id).as_slice().cmp(&bytes))
            .ok()
            .map(|i| self.ids_by_bytes[i])
    }
}

/// The pre-tokenizer split of a regex ending in `|\s+(?!\S)|\s+` (Qwen, cl100k, o200k style)
/// without fancy-regex: the `\s+(?!\S)` branch is dropped and emulated. That branch, given a
/// whitespace run of two or more characters followed by a non-space, takes all but the last
/// character; with it dropped, `\s+` takes the whole run, so such a match is shortened by one
/// character and the next search starts at the last one, as before. fancy-regex runs
/// `\s+(?!\S)` on a backtracking stack that overflows on a run of about a million spaces
/// (HuggingFace's Oniguruma handles it), and the plain `regex` crate is faster besides.
struct WhitespaceSplit {
    regex: regex::Regex,
}

impl WhitespaceSplit {
    const TAIL: &'static str = r"|\s+(?!\S)|\s+";

    fn new(pattern: &str) -> Option<WhitespaceSplit> {
        let head = pattern.strip_suffix(Self::TAIL)?;
        let regex = regex::Regex::new(&format!(r"{head}|\s+")).ok()?;
        Some(WhitespaceSplit { regex })
    }

    fn pieces<'t>(&'t self, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
        let mut start = 0;
        std::iter::from_fn(move || {
            let m = self.regex.find_at(text, start)?;
            let mut end = m.end();
            let piece = m.as_str();
            // A `\s+` match: whitespace not ending in a newline (the earlier branches of these
            // regexes never match such text: they need a letter, digit, punctuation or newline).
            if end < text.len() && piece.chars().all(char::is_whitespace) {
                let mut chars = piece.chars();
                if let (Some(last), Some(_)) = (chars.next_back(), chars.next()) {
                    if last != '\r' && last != '\n' {
                        end -= last.len_utf8();
                    }
                }
            }
            start = end;
            Some(&text[m.start()..end])
        })
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
        // Rank BPE takes a pre-token that is a whole token as is; HF without ignore_merges
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

/// Rank BPE equals HuggingFace's merge-list BPE when the merges are exactly the ones derived
/// from the ranks (see [`derive_merges`]).
fn check_merges(merges: &[MergeEntry<'_>], ranks: &[Vec<u8>]) -> Result<(), String> {
    let expected = derive_merges(ranks);
    if merges.len() != expected.len() {
        return Err(format!(
            "merges are not the rank-derived set ({} in the file, {} derived)",
            merges.len(),
            expected.len()
        ));
    }
    for (index, (entry, &(l, r))) in merges.iter().zip(&expected).enumerate() {
        let same = entry.halves().is_some_and(|(fl, fr)| {
            spells(fl, &ranks[l as usize]) && spells(fr, &ranks[r as usize])
        });
        if !same {
            return Err(format!(
                "merge {index} is not the rank-derived one (merges not in rank order)"
            ));
        }
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

    /// Writes the tiny tokenizer, edited by `edit`, to a fresh file and loads it.
    fn load_tiny(name: &str, edit: impl FnOnce(&mut Value)) -> Tokenizer {
        let hf = build_tokenizer(&tiny_ranks(), &TINY).unwrap();
        let mut json: Value = serde_json::from_str(&hf.to_string(false).unwrap()).unwrap();
        edit(&mut json);
        let dir = std::env::temp_dir().join(format!("tokengate-engine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::load(&path).unwrap()
    }

    fn reason(t: &Tokenizer) -> String {
        match t.engine() {
            Engine::Fast => "fast".to_owned(),
            Engine::HfFallback { reason } => reason,
        }
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
                "merge-order",
                Box::new(|j| j["model"]["merges"].as_array_mut().unwrap().swap(0, 1)),
                "merge 0 is not the rank-derived one (merges not in rank order)",
            ),
            (
                "merge-missing",
                Box::new(|j| {
                    j["model"]["merges"].as_array_mut().unwrap().pop();
                }),
                "merges are not the rank-derived set (11 in the file, 12 derived)",
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
        assert_eq!(no_normalizer.engine(), Engine::Fast);
        assert_eq!(no_normalizer.encode("e\u{301}"), vec![101, 204, 129]);
    }
}
