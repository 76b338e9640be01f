//! Tokenizer room: the imported Qwen3.5 tokenizer.json, loaded by both engines, against ids
//! computed independently from the raw tiktoken ranks with tiktoken-rs.

mod common;

use std::sync::OnceLock;

use base64::Engine as _;
use tiktoken_rs::CoreBPE;
use tokengate::tokenize::preset::QWEN3_5;
use tokengate::tokenize::{Engine, EngineChoice, Tokenizer};
use unicode_normalization::UnicodeNormalization;

fn fast() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::load(&common::tokenizer_json()).unwrap())
}

fn hf() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::load_with(&common::tokenizer_json(), EngineChoice::Hf).unwrap())
}

/// tiktoken over the raw ranks file with the 33 specials, text NFC-normalized first.
fn reference() -> &'static CoreBPE {
    static T: OnceLock<CoreBPE> = OnceLock::new();
    T.get_or_init(|| {
        let text = std::fs::read_to_string(common::asset("qwen3_6.tiktoken")).unwrap();
        let ranks = text
            .lines()
            .map(|line| {
                let (b64, rank) = line.split_once(' ').unwrap();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap();
                (bytes, rank.parse::<u32>().unwrap())
            })
            .collect();
        let specials = QWEN3_5
            .added_tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), 248_044 + i as u32))
            .collect();
        CoreBPE::new(ranks, specials, QWEN3_5.pattern).unwrap()
    })
}

fn reference_ids(text: &str) -> Vec<u32> {
    let nfc: String = text.nfc().collect();
    reference().encode_with_special_tokens(&nfc)
}

const SAMPLES: &[&str] = &[
    "Hello, world!",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "def f(x):\n    return x**2  # square\r\n",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "{\"key\": [1, 2.5, -3e10, null, true], \"名字\": \"值\"}",
    "1234567890 3.14159 0x1F 1,000,000",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "<|im_end|><|im_end|><|endoftext|>",
    "<|im_end",
    "<|im_end|",
    "<<|im_end|>>",
    "<tool_call><tool_response></tool_response>",
    "e\u{301}cole cafe\u{301} Å Å",
    "\u{a0}\u{3000}\u{2028}x\t\t\n\n  \r\n",
    "   leading and trailing   ",
    "👩‍👩‍👧‍👦 🇨🇳🇺🇸 👍🏽",
    "한국어 텍스트 \u{1100}\u{1161}\u{11a8}",
    "",
    " ",
    "don't I'LL we've THEY'RE",
];

#[test]
fn loads_the_fast_engine_with_the_full_vocabulary() {
    assert_eq!(fast().engine(), Engine::Fast);
    assert_eq!(fast().vocab_size(), 248_077);
    assert_eq!(
        hf().engine(),
        Engine::HfFallback {
            reason: "HuggingFace engine requested".to_owned()
        }
    );
    assert_eq!(hf().vocab_size(), 248_077);
}

#[test]
fn token_ids_of_added_and_vocabulary_tokens() {
    for t in [fast(), hf()] {
        assert_eq!(t.token_id("<|endoftext|>"), Some(248_044));
        assert_eq!(t.token_id("<|im_end|>"), Some(248_046));
        assert_eq!(t.token_id("<think>"), Some(248_068));
        assert_eq!(t.token_id("<|audio_pad|>"), Some(248_076));
        assert_eq!(t.token_id("!"), Some(0));
        assert_eq!(t.token_id("Ċ"), Some(198));
        assert_eq!(t.token_id("Ġ"), Some(220));
        assert_eq!(t.token_id("not a token at all"), None);
        assert_eq!(t.token_id(" "), None);
    }
}

#[test]
fn both_engines_match_tiktoken_on_the_raw_ranks() {
    for text in SAMPLES {
        let expected = reference_ids(text);
        assert_eq!(fast().encode(text), expected, "fast engine on {text:?}");
        assert_eq!(hf().encode(text), expected, "HF engine on {text:?}");
        assert_eq!(fast().count(text), expected.len(), "fast count on {text:?}");
        assert_eq!(hf().count(text), expected.len(), "HF count on {text:?}");
    }
}

#[test]
fn exact_ids_of_a_chat_turn() {
    let text = "<|im_start|>user\nhi<|im_end|>\n";
    assert_eq!(fast().encode(text), [248_045, 846, 198, 5834, 248_046, 198]);
}

#[test]
fn special_token_before_combining_solidus_follows_huggingface() {
    // HF matches `<think>` on the raw text, then normalizes the rest (U+0338 alone); tiktoken
    // normalizes first, turning `>` + U+0338 into `≯`, so the special token disappears.
    let text = "<think>\u{338}";
    assert_eq!(fast().encode(text), [248_068, 136, 116]);
    assert_eq!(hf().encode(text), [248_068, 136, 116]);
    assert_ne!(reference_ids(text), [248_068, 136, 116]);
}

#[test]
fn decode_inverts_encode_up_to_nfc() {
    for text in SAMPLES {
        let nfc: String = text.nfc().collect();
        assert_eq!(fast().decode(&fast().encode(text)), nfc, "fast on {text:?}");
        assert_eq!(hf().decode(&hf().encode(text)), nfc, "HF on {text:?}");
    }
}

#[test]
fn decode_replaces_broken_utf8_and_skips_unknown_ids() {
    // 136, 116 are the two bytes of U+0338; one alone is invalid UTF-8.
    for t in [fast(), hf()] {
        assert_eq!(t.decode(&[136]), "\u{fffd}");
        assert_eq!(t.decode(&[136, 116]), "\u{338}");
        assert_eq!(t.decode(&[9419, 999_999, 248_046]), "Hello<|im_end|>");
    }
}

#[test]
fn million_character_whitespace_runs_match_huggingface() {
    // fancy-regex's `\s+(?!\S)` overflows its backtracking stack near a million spaces; the fast
    // engine splits whitespace without it. 7,814 is what HF (Python) gives for the first text.
    let spaces = " ".repeat(1_000_000) + "x";
    assert_eq!(fast().count(&spaces), 7_814);
    for text in [
        spaces,
        "\t".repeat(300_000) + "y",
        "\u{3000}".repeat(200_000) + "z z",
        " ".repeat(500_000),
        "a  \u{a0}\u{a0} b\t\t\n \n  c \r\n  ".repeat(20_000),
    ] {
        assert_eq!(fast().encode(&text), hf().encode(&text), "{}", &text[..12]);
    }
}

#[test]
fn every_assigned_plane_encodes_identically_in_both_engines() {
    // Each code point between letters, digits and spaces, so every regex class (\p{L}, \p{M},
    // \p{N}, \s) and NFC (composition with the previous letter) is exercised. Planes 0-3 and 14
    // hold every assigned character; planes 4-13 (unassigned) and 15-16 (private use) are
    // uniform, so a sample of them is enough.
    let dense = (0..=0x3FFFFu32).chain(0xE0000..=0xE0FFF);
    let sampled = (0x40000..=0x10FFFFu32).step_by(97);
    let chars: Vec<char> = dense.chain(sampled).filter_map(char::from_u32).collect();
    let mut mismatches = Vec::new();
    for chunk in chars.chunks(4096) {
        let text: String = chunk.iter().map(|c| format!("a{c}1 {c}{c}\n")).collect();
        if fast().encode(&text) != hf().encode(&text) {
            mismatches.push(chunk[0] as u32);
        }
    }
    assert_eq!(
        mismatches,
        Vec::<u32>::new(),
        "chunks starting at these code points differ"
    );
}

/// Lines whose ids differ between the engines, of 20,000 random lines of 1 to 24 of `pieces`
/// each (drawn with `seed`): checked 500 lines to a text, each line of a differing text alone.
fn lines_that_differ(pieces: &[String], seed: u64) -> Vec<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let lines: Vec<String> = (0..20_000)
        .map(|_| {
            let len = rng.gen_range(1..=24);
            (0..len)
                .map(|_| pieces[rng.gen_range(0..pieces.len())].as_str())
                .collect()
        })
        .collect();
    lines
        .chunks(500)
        .filter(|chunk| {
            let text = chunk.join("\n");
            fast().encode(&text) != hf().encode(&text)
        })
        .flat_map(|chunk| chunk.iter().filter(|l| fast().encode(l) != hf().encode(l)))
        .cloned()
        .collect()
}

#[test]
fn runs_of_vocabulary_characters_match_huggingface() {
    // The fast engine starts some characters from their token instead of their bytes; random
    // runs of every non-ASCII character that is a token, with letters, digits and punctuation
    // between, check that this never changes an id.
    let mut chars: Vec<String> = (0..248_044u32)
        .map(|id| fast().decode(&[id]))
        .filter(|t| t.chars().count() == 1 && !t.is_ascii() && !t.contains('\u{fffd}'))
        .collect();
    assert_eq!(chars.len(), 8_090);
    chars.extend(["a", "Z", "7", " ", "'", "-", "。"].map(String::from));
    assert_eq!(lines_that_differ(&chars, 7), Vec::<String>::new());
}

#[test]
fn ascii_and_what_borders_it_match_huggingface() {
    // The fast engine splits ASCII text without the regex, and passes runs below U+0300 over
    // without decoding them for NFC: random runs of every ASCII character, of the contractions,
    // and of the non-ASCII characters that continue or change an ASCII match (U+017F folds to
    // `s`; U+0085, U+00A0, U+2028 and U+3000 are whitespace; U+0301 a mark; U+00E9 a letter
    // below U+0300; U+2026 punctuation; U+0661 a digit) check that this never changes an id.
    let mut pieces: Vec<String> = (0..128u8).map(|b| char::from(b).to_string()).collect();
    pieces.extend(
        [
            "'s", "'S", "'re", "'RE", "'ve", "'ll", "'Ll", "'m", "'d", "'t", "\r\n", "  ",
            "\u{17f}", "\u{85}", "\u{a0}", "\u{2028}", "\u{3000}", "\u{301}", "\u{e9}", "\u{2026}",
            "\u{661}", "\u{4e2d}",
        ]
        .map(String::from),
    );
    assert_eq!(lines_that_differ(&pieces, 11), Vec::<String>::new());
}

#[test]
fn jsonl_lines_are_counted_with_the_tokenizer_and_the_chat_template() {
    use tokengate::cli::tokenize::{count_line, run_jsonl};
    use tokengate::tokenize::chat::ChatTemplate;
    let template = ChatTemplate::builtin_qwen35();
    let input: &[u8] = b"{\"text\": \"Hello, world!\"}\n{\"text\": 5}\n\
        {\"messages\": [{\"role\": \"user\", \"content\": \"Hello, world!\"}]}\n\
        {\"messages\": [{\"role\": \"user\", \"content\": \"Hello, world!\"}], \"chat_template_kwargs\": {\"enable_thinking\": false}}\n\
        {\"messages\": [{\"role\": \"user\", \"content\": \"Hello, world!\"}], \"add_generation_prompt\": false}\n";
    let mut output = Vec::new();
    run_jsonl(input, &mut output, |line| {
        count_line(fast(), &template, line)
    })
    .unwrap();
    // A user message costs its content + 5 framing tokens; the generation prompt (there unless
    // the line says false, as in a request) 5, or 7 with thinking disabled.
    assert_eq!(
        String::from_utf8(output).unwrap(),
        "{\"count\":4}\n{\"error\":\"\\\"text\\\" must be a string\"}\n{\"count\":14}\n{\"count\":16}\n{\"count\":9}\n"
    );
}

#[test]
fn counting_with_a_ceiling_is_exact_below_it_and_stops_just_past_it() {
    use tokengate::tokenize::TokenCount;
    let long = SAMPLES.join(" ").repeat(20);
    for text in SAMPLES.iter().copied().chain([long.as_str()]) {
        let n = fast().count(text);
        for ceiling in (0..n + 2).step_by(1 + n / 64) {
            for t in [fast(), hf()] {
                // Exact up to the ceiling; past it, a lower bound past the ceiling.
                match t.count_up_to(text, ceiling) {
                    TokenCount::Exact(m) => assert!(m == n && n <= ceiling, "{text:?}: {m}"),
                    TokenCount::AtLeast(m) => assert!(ceiling < m && m <= n, "{text:?}: {m}"),
                }
            }
        }
    }
    // Pre-tokens of one token each (an added token, words, a newline): it stops at the first
    // token past the ceiling.
    let text = format!("<|im_start|>user\nhello{}", " hello".repeat(100_000));
    assert_eq!(fast().count(&text), 100_004);
    for t in [fast(), hf()] {
        assert_eq!(t.count_up_to(&text, 0), TokenCount::AtLeast(1));
        assert_eq!(t.count_up_to(&text, 4_096), TokenCount::AtLeast(4_097));
        assert_eq!(t.count_up_to(&text, 100_003), TokenCount::AtLeast(100_004));
        assert_eq!(t.count_up_to(&text, 100_004), TokenCount::Exact(100_004));
        assert_eq!(t.count_up_to("", 0), TokenCount::Exact(0));
    }
}

#[test]
fn counting_past_a_ceiling_reads_no_more_than_the_ceiling_needs() {
    use tokengate::tokenize::TokenCount;
    // No Qwen token is longer than 128 bytes, so 4,097 x 128 bytes of text hold more than
    // 4,096 tokens: the fast engine stops there without normalizing, splitting or merging the
    // rest. Each text here is one pre-token of 4 MiB, the costliest input per byte (BPE over
    // millions of symbols took seconds, and NFC of a text not in NFC a second and a half):
    // plain letters, letters not in NFC, spaces, a script outside the plainly-NFC ranges. Merged
    // whole, each would count far more than 4,097 (e.g. 524,288 for the first); 4,097 is what
    // reading the first 4,097 x 128 bytes shows.
    let texts = [
        "a".repeat(4 << 20),
        format!("e\u{301}{}", "a".repeat(4 << 20)),
        " ".repeat(4 << 20) + "x",
        "\u{627}\u{644}".repeat(1 << 20),
    ];
    for text in &texts {
        assert_eq!(
            fast().count_up_to(text, 4_096),
            TokenCount::AtLeast(4_097),
            "{}",
            &text[..8]
        );
    }
    // Under the ceiling nothing changes: the same texts, cut short, count exactly.
    for text in &texts {
        let short: String = text.chars().take(2_000).collect();
        assert_eq!(
            fast().count_up_to(&short, 4_096),
            TokenCount::Exact(hf().count(&short))
        );
    }
}

#[test]
fn char_spans_are_huggingfaces_offsets() {
    // Random lines of what NFC composes (e + U+0301, a Hangul jamo run), reorders (two marks),
    // replaces (U+212B) and splits in two (U+0344, U+0F73), of characters one token splits
    // (CJK, emoji, a ZWJ sequence) and of added tokens, beside the samples.
    use rand::{Rng, SeedableRng};
    let pieces = [
        "e\u{301}",
        "\u{344}",
        "\u{f73}",
        "\u{212b}",
        "\u{1100}\u{1161}\u{11a8}",
        "a\u{323}\u{301}",
        "a\u{301}\u{323}",
        "\u{301}",
        "中",
        "🚀",
        "👩\u{200d}💻",
        " ",
        "  ",
        "x",
        "word",
        "\n",
        "<|im_start|>",
        "<|im_end|>",
        "'s",
        "7",
        "é",
        "\u{a0}",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let lines = (0..5_000).map(|_| {
        let len = rng.gen_range(1..=16);
        (0..len)
            .map(|_| pieces[rng.gen_range(0..pieces.len())])
            .collect::<String>()
    });
    for text in SAMPLES.iter().map(|s| s.to_string()).chain(lines) {
        assert_eq!(fast().char_spans(&text), hf().char_spans(&text), "{text:?}");
        // The fast engine merges no more than a cut needs; HuggingFace's reads it all.
        for most in 1..4 {
            assert_eq!(
                fast().cut_to_tokens(&text, most),
                hf().cut_to_tokens(&text, most),
                "{text:?} to {most}"
            );
        }
    }
    // A composed char stands for its first; a token of part of a char covers all of it.
    for t in [fast(), hf()] {
        assert_eq!(
            t.char_spans("e\u{301} 👩\u{200d}💻"),
            [(0, 1), (2, 4), (3, 4), (4, 5), (4, 5), (5, 6), (5, 6)]
        );
    }
}

#[test]
fn texts_are_cut_to_tokens_as_vllm_cuts_scored_texts() {
    // What vLLM 0.32's `truncate_text_to_tokens` (max_tokens_per_query, max_tokens_per_doc)
    // makes of each, with the Qwen3.5 tokenizer in transformers.
    let cases = [
        ("hello there my friend", 3, "hello there my"),
        (
            "東京から大阪まで新幹線で何分かかりますか？",
            4,
            "東京から大阪まで",
        ),
        (
            "emoji test 🚀🔥 — does 👩\u{200d}💻 count",
            5,
            "emoji test 🚀",
        ),
        ("<|im_start|>user\nhi<|im_end|>", 2, "<|im_start|>user"),
        ("e\u{301}cole cafe\u{301} Å", 2, "e\u{301}cole cafe"),
        ("cafe\u{301}s cafe\u{301}s", 1, "caf"),
        ("a\u{344}b c", 1, "a"),
        ("a", 1, "a"),
        ("abc def", 1, "abc"),
        ("👩\u{200d}👩\u{200d}👧\u{200d}👦 family", 2, ""),
        ("  spaced  out  ", 2, "  spaced"),
        ("anything", 0, ""),
    ];
    for t in [fast(), hf()] {
        for (text, most, cut) in cases {
            // The cut, and its tokens as counted alone.
            assert_eq!(
                t.cut_to_tokens(text, most),
                (cut, t.count(cut)),
                "{text:?} to {most}"
            );
        }
    }
}
