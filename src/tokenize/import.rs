//! Tokenizer room: `tokenizer import`, building a HuggingFace `tokenizer.json` from a tiktoken
//! ranks file (one `base64(token) rank` per line) and a [`Preset`].
//!
//! The conversion follows transformers' `TikTokenConverter`: the vocabulary spells each token in
//! the GPT-2 byte alphabet with its rank as id; the merges list, for each token in rank order,
//! EVERY split `(l, r)` of its bytes with both halves in the vocabulary, ordered by
//! `(rank l, rank r)`; and the model ignores merges for pre-tokens that are whole tokens. With
//! one split per token, or without `ignore_merges`, the result disagrees with tiktoken.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use base64::Engine as _;
use rustc_hash::FxHashMap;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::byte_level::bytes_to_string;
use super::preset::Preset;

/// Parses a tiktoken ranks file. Returns the token bytes indexed by rank; ranks must be exactly
/// `0..n`, each once, and tokens distinct.
pub fn parse_tiktoken(text: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let (Some(b64), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            bail!("line {line_no}: expected `base64(token) rank`");
        };
        let token = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .with_context(|| format!("line {line_no}: bad base64 {b64:?}"))?;
        let rank: u32 = rank
            .parse()
            .with_context(|| format!("line {line_no}: bad rank {rank:?}"))?;
        if token.is_empty() {
            bail!("line {line_no}: empty token");
        }
        if let Some(other) = seen.insert(token.clone(), rank) {
            bail!("line {line_no}: token of rank {rank} repeats rank {other}");
        }
        let slot = rank as usize;
        if by_rank.len() <= slot {
            by_rank.resize(slot + 1, None);
        }
        if by_rank[slot].replace(token).is_some() {
            bail!("line {line_no}: rank {rank} appears twice");
        }
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(rank, token)| token.with_context(|| format!("rank {rank} is missing")))
        .collect()
}

/// The merges of a rank-ordered vocabulary, as pairs of ranks, in merge-priority order: for each
/// token in rank order, every split `(l, r)` with both halves in the vocabulary, sorted by
/// `(rank l, rank r)`.
pub fn derive_merges<T: AsRef<[u8]>>(tokens: &[T]) -> Vec<(u32, u32)> {
    // Fx: ~3 million short-key lookups on every tokenizer load.
    let rank_of: FxHashMap<&[u8], u32> = tokens
        .iter()
        .enumerate()
        .map(|(rank, t)| (t.as_ref(), rank as u32))
        .collect();
    let mut merges = Vec::new();
    let mut splits = Vec::new();
    for token in tokens {
        let token = token.as_ref();
        splits.clear();
        for cut in 1..token.len() {
            if let (Some(&l), Some(&r)) = (rank_of.get(&token[..cut]), rank_of.get(&token[cut..])) {
                splits.push((l, r));
            }
        }
        splits.sort_unstable();
        merges.extend_from_slice(&splits);
    }
    merges
}

/// Builds the HuggingFace tokenizer for rank-ordered `tokens` and `preset`.
pub fn build_tokenizer(
    tokens: &[Vec<u8>],
    preset: &Preset,
) -> anyhow::Result<tokenizers::Tokenizer> {
    let spelled: Vec<String> = tokens.iter().map(|t| bytes_to_string(t)).collect();
    let vocab: Vocab = spelled
        .iter()
        .enumerate()
        .map(|(rank, s)| (s.clone(), rank as u32))
        .collect();
    let merges = derive_merges(tokens)
        .into_iter()
        .map(|(l, r)| (spelled[l as usize].clone(), spelled[r as usize].clone()))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .map_err(|e| anyhow::anyhow!("building the BPE model: {e}"))?;

    let split = Split::new(
        SplitPattern::Regex(preset.pattern.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow::anyhow!("preset {} regex: {e}", preset.name))?;
    let byte_level = ByteLevel::new(false, false, false);

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])))
        .with_decoder(Some(byte_level));
    let added: Vec<AddedToken> = preset
        .added_tokens
        .iter()
        .map(|t| AddedToken::from(*t, true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&added);
    for (offset, token) in preset.added_tokens.iter().enumerate() {
        let expected = (tokens.len() + offset) as u32;
        if tokenizer.token_to_id(token) != Some(expected) {
            bail!("added token {token} did not get id {expected}: it clashes with the ranks");
        }
    }
    Ok(tokenizer)
}

/// Sizes of an imported tokenizer, for the CLI's summary line and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportSummary {
    /// Number of ranks (base vocabulary).
    pub vocab: usize,
    /// Number of merges written.
    pub merges: usize,
    /// Number of added tokens.
    pub added_tokens: usize,
}

/// Reads `tiktoken`, converts it with `preset` and writes `tokenizer.json` to `out`.
pub fn import_file(tiktoken: &Path, preset: &Preset, out: &Path) -> anyhow::Result<ImportSummary> {
    let text = std::fs::read_to_string(tiktoken)
        .with_context(|| format!("reading {}", tiktoken.display()))?;
    let tokens =
        parse_tiktoken(&text).with_context(|| format!("parsing {}", tiktoken.display()))?;
    let tokenizer = build_tokenizer(&tokens, preset)?;
    tokenizer
        .save(out, false)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    Ok(ImportSummary {
        vocab: tokens.len(),
        merges: derive_merges(&tokens).len(),
        added_tokens: preset.added_tokens.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn parses_ranks_in_any_line_order() {
        let text = format!("{} 1\n{} 0\n\n{} 2\n", b64(b"b"), b64(b"a"), b64(b"ab"));
        let tokens = parse_tiktoken(&text).unwrap();
        assert_eq!(tokens, vec![b"a".to_vec(), b"b".to_vec(), b"ab".to_vec()]);
    }

    #[test]
    fn rejects_gaps_duplicates_and_garbage() {
        let gap = format!("{} 0\n{} 2\n", b64(b"a"), b64(b"b"));
        assert_eq!(
            parse_tiktoken(&gap).unwrap_err().to_string(),
            "rank 1 is missing"
        );
        let dup_rank = format!("{} 0\n{} 0\n", b64(b"a"), b64(b"b"));
        assert_eq!(
            parse_tiktoken(&dup_rank).unwrap_err().to_string(),
            "line 2: rank 0 appears twice"
        );
        let dup_token = format!("{} 0\n{} 1\n", b64(b"a"), b64(b"a"));
        assert_eq!(
            parse_tiktoken(&dup_token).unwrap_err().to_string(),
            "line 2: token of rank 1 repeats rank 0"
        );
        assert_eq!(
            parse_tiktoken("YQ== x\n").unwrap_err().to_string(),
            "line 1: bad rank \"x\""
        );
        assert_eq!(
            parse_tiktoken("YQ==\n").unwrap_err().to_string(),
            "line 1: expected `base64(token) rank`"
        );
    }

    #[test]
    fn merges_list_every_split_ordered_by_ranks_of_the_halves() {
        // ranks: a=0 b=1 c=2 ab=3 bc=4 abc=5 ("abc" splits as a+bc and ab+c)
        let tokens: Vec<&[u8]> = vec![b"a", b"b", b"c", b"ab", b"bc", b"abc"];
        assert_eq!(derive_merges(&tokens), vec![(0, 1), (1, 2), (0, 4), (3, 2)]);
        // merges follow the rank of the merged token, not of its halves
        let tokens: Vec<&[u8]> = vec![b"x", b"yz", b"xyz", b"y", b"z"];
        assert_eq!(derive_merges(&tokens), vec![(3, 4), (0, 1)]);
    }
}
