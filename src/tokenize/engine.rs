//! Tokenizer room: [`Tokenizer`], the model's tokenizer loaded from a HuggingFace
//! `tokenizer.json`.
//!
//! The `tokenizers` crate is the loader and the reference. When the file is representable
//! exactly by a rank-based byte-level BPE (the tiktoken algorithm) the tokenizer runs a fast
//! engine built from it and drops the HuggingFace object; otherwise it keeps the HuggingFace
//! object and says why at load. The fast engine reproduces HuggingFace's order of operations:
//! added tokens are matched on the raw text first, each segment between them is NFC-normalized
//! (only when a quick check says it may not be already), then split by the regex and BPE-encoded.

use std::collections::HashMap;
use std::path::Path;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use anyhow::Context;
use serde::Deserialize;
use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::{ModelWrapper, NormalizedString, Normalizer};
use unicode_normalization::{is_nfc_quick, IsNormalized};

use super::byte_level::string_to_bytes;
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
        let hf = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", path.display()))?;
        let fast = match choice {
            EngineChoice::Hf => Err("HuggingFace engine requested".to_owned()),
            EngineChoice::Auto => FastEngine::from_hf(&hf, path)?,
        };
        let tokenizer = match fast {
            Ok(fast) => Tokenizer {
                engine: Engine::Fast,
                imp: Imp::Fast(Box::new(fast)),
            },
            Err(reason) => Tokenizer {
                engine: Engine::HfFallback { reason },
                imp: Imp::Hf(Box::new(hf)),
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
    /// Added tokens, matched leftmost-longest on the raw text (as HuggingFace does).
    added: Option<AhoCorasick>,
    /// Id of each `added` pattern.
    added_ids: Vec<u32>,
    added_by_content: HashMap<String, u32>,
    nfc: bool,
    /// Bytes of each id (decode); `None` for ids that do not exist.
    pieces: Vec<Option<Box<[u8]>>>,
    /// Base-vocabulary ids sorted by their bytes (`token_id` by binary search).
    ids_by_bytes: Vec<u32>,
    vocab_size: usize,
}

/// The model section of `tokenizer.json` as far as the merges go (HuggingFace does not expose
/// them after loading).
#[derive(Deserialize)]
struct FileMerges {
    model: ModelMerges,
}

#[derive(Deserialize)]
struct ModelMerges {
    #[serde(default)]
    merges: Vec<MergeEntry>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MergeEntry {
    Pair(String, String),
    Legacy(String),
}

impl MergeEntry {
    fn halves(&self) -> Option<(&str, &str)> {
        match self {
            MergeEntry::Pair(l, r) => Some((l, r)),
            MergeEntry::Legacy(s) => s.split_once(' '),
        }
    }
}

impl FastEngine {
    /// The fast engine for `hf`, `Ok(Err(reason))` when it would not be exact, `Err` when the
    /// file cannot be read again.
    fn from_hf(
        hf: &tokenizers::Tokenizer,
        path: &Path,
    ) -> anyhow::Result<Result<FastEngine, String>> {
        let bpe = match hf.get_model() {
            ModelWrapper::BPE(bpe) => bpe,
            _ => return Ok(Err("model is not BPE".to_owned())),
        };
        if let Err(reason) = check_bpe(bpe) {
            return Ok(Err(reason));
        }
        let nfc = match hf.get_normalizer() {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return Ok(Err("normalizer is neither NFC nor absent".to_owned())),
        };
        let pattern = match split_pattern(hf) {
            Ok(pattern) => pattern,
            Err(reason) => return Ok(Err(reason)),
        };
        if let Err(reason) = check_decoder_and_post_processor(hf) {
            return Ok(Err(reason));
        }

        // Ranks: ids of the byte-level vocabulary.
        let vocab = bpe.get_vocab();
        let n_ranks = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        if n_ranks != vocab.len() {
            return Ok(Err("vocabulary ids are not dense".to_owned()));
        }
        let mut ranks: Vec<Vec<u8>> = vec![Vec::new(); n_ranks];
        for (token, &id) in &vocab {
            match string_to_bytes(token) {
                Some(bytes) => ranks[id as usize] = bytes,
                None => return Ok(Err(format!("vocabulary token {token:?} is not byte-level"))),
            }
        }
        drop(vocab);

        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: FileMerges = serde_json::from_str(&text)
            .with_context(|| format!("reading merges of {}", path.display()))?;
        drop(text);
        if let Err(reason) = check_merges(&file.model.merges, &ranks) {
            return Ok(Err(reason));
        }
        drop(file);

        let mut added_contents = Vec::new();
        let mut added_ids = Vec::new();
        let mut pieces: Vec<Option<Box<[u8]>>> = ranks
            .iter()
            .map(|t| Some(t.clone().into_boxed_slice()))
            .collect();
        let mut ids_by_bytes: Vec<u32> = (0..n_ranks as u32).collect();
        ids_by_bytes.sort_unstable_by(|&a, &b| ranks[a as usize].cmp(&ranks[b as usize]));
        let mut specials: HashMap<String, u32> = HashMap::new();
        let mut added_tokens: Vec<(u32, tokenizers::AddedToken)> =
            hf.get_added_tokens_decoder().into_iter().collect();
        added_tokens.sort_by_key(|(id, _)| *id);
        for (id, token) in added_tokens {
            if !token.special
                || token.normalized
                || token.single_word
                || token.lstrip
                || token.rstrip
            {
                return Ok(Err(format!(
                    "added token {:?} is not a plain special token",
                    token.content
                )));
            }
            let index = id as usize;
            if pieces.len() <= index {
                pieces.resize(index + 1, None);
            }
            // As HuggingFace's ByteLevel decoder: byte-level spelling if it is one, else UTF-8.
            let bytes = string_to_bytes(&token.content)
                .unwrap_or_else(|| token.content.as_bytes().to_vec());
            pieces[index] = Some(bytes.into_boxed_slice());
            specials.insert(token.content.clone(), id);
            added_contents.push(token.content);
            added_ids.push(id);
        }
        let added = if added_contents.is_empty() {
            None
        } else {
            Some(
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&added_contents)
                    .context("building the added-token matcher")?,
            )
        };

        let encoder = ranks
            .into_iter()
            .enumerate()
            .map(|(rank, bytes)| (bytes, rank as u32))
            .collect();
        let bpe = match CoreBPE::new(encoder, specials.clone().into_iter().collect(), &pattern) {
            Ok(bpe) => bpe,
            Err(e) => {
                return Ok(Err(format!(
                    "split regex not supported by fancy-regex: {e}"
                )))
            }
        };
        let vocab_size = hf.get_vocab_size(true);
        Ok(Ok(FastEngine {
            bpe,
            added,
            added_ids,
            added_by_content: specials,
            nfc,
            pieces,
            ids_by_bytes,
            vocab_size,
        }))
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
            sink(&self.bpe.encode_ordinary(normalized.get()));
        } else {
            sink(&self.bpe.encode_ordinary(segment));
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(Some(piece)) = self.pieces.get(id as usize) {
                bytes.extend_from_slice(piece);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn token_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.added_by_content.get(token) {
            return Some(id);
        }
        let bytes = string_to_bytes(token)?;
        let piece = |id: u32| self.pieces[id as usize].as_deref().unwrap_or_default();
        self.ids_by_bytes
            .binary_search_by(|&id| piece(id).cmp(&bytes[..]))
            .ok()
            .map(|i| self.ids_by_bytes[i])
    }
}

/// The BPE options that rank-based BPE cannot express.
fn check_bpe(bpe: &BPE) -> Result<(), String> {
    if bpe.dropout.is_some() {
        return Err("BPE dropout is set".to_owned());
    }
    if bpe.byte_fallback {
        return Err("BPE byte_fallback is set".to_owned());
    }
    if bpe.continuing_subword_prefix.is_some() || bpe.end_of_word_suffix.is_some() {
        return Err("BPE has a subword prefix or suffix".to_owned());
    }
    if !bpe.ignore_merges {
        // Rank BPE takes a pre-token that is a whole token as is; HF without ignore_merges
        // may split it.
        return Err("BPE ignore_merges is false".to_owned());
    }
    Ok(())
}

/// The split regex of a `Sequence[Split(regex, Isolated), ByteLevel(no prefix, no regex)]`
/// pre-tokenizer.
fn split_pattern(hf: &tokenizers::Tokenizer) -> Result<String, String> {
    let pre = serde_json::to_value(hf.get_pre_tokenizer()).map_err(|e| e.to_string())?;
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

fn check_decoder_and_post_processor(hf: &tokenizers::Tokenizer) -> Result<(), String> {
    let decoder = serde_json::to_value(hf.get_decoder()).map_err(|e| e.to_string())?;
    if decoder["type"] != "ByteLevel" {
        return Err("decoder is not ByteLevel".to_owned());
    }
    let post = serde_json::to_value(hf.get_post_processor()).map_err(|e| e.to_string())?;
    // A ByteLevel post-processor only trims offsets; ids are unchanged.
    if post != Value::Null && post["type"] != json!("ByteLevel") {
        return Err("post-processor adds or changes tokens".to_owned());
    }
    Ok(())
}

/// Rank BPE equals HuggingFace's merge-list BPE when the merges are exactly the ones derived
/// from the ranks (see [`derive_merges`]).
fn check_merges(merges: &[MergeEntry], ranks: &[Vec<u8>]) -> Result<(), String> {
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
            string_to_bytes(fl).as_deref() == Some(&ranks[l as usize][..])
                && string_to_bytes(fr).as_deref() == Some(&ranks[r as usize][..])
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
