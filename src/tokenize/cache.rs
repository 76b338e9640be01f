//! Memoized chat counting (tokenize room): multi-turn clients resend the whole history every
//! turn, so the rendered prompt is cut into turn spans (see [`crate::tokenize::chat::spans`])
//! and each span's token count is remembered with its text in a cache bounded in bytes. A
//! follow-up turn tokenizes only what is new; the rest is looked up.
//!
//! The cache is cut into shards by span hash, each with its own lock and an equal part of the
//! byte bound, so the threads counting at once (tokenizer workers, and executor threads counting
//! small prompts inline) seldom wait for each other. Each shard evicts its own least recently
//! used spans.

use super::chat::{spans, ChatPrompt, ChatTemplate, CountTokens, TemplateError};
use super::pool::INLINE_BYTES;
use super::TokenCount;
use hashbrown::HashTable;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// One cached span: its text, hash, count and recency links.
///
/// The text is kept and compared on every hit, so a count is only ever returned for the very
/// text it was counted from: two spans with the same hash, by chance or crafted by a client,
/// are two entries. The hash (foldhash, seeded at random per process) only finds candidates;
/// it reads the 10 KB of a long chat's history in well under a microsecond, where a
/// cryptographic digest that could stand in for the text took about 10 µs.
#[derive(Debug)]
struct Entry {
    text: Box<str>,
    hash: u64,
    tokens: usize,
    prev: u32,
    next: u32,
}

/// Bytes a cached span costs besides its text: its entry and its slot in the index (the hash
/// table's spare capacity is not counted).
pub const ENTRY_OVERHEAD: usize = std::mem::size_of::<Entry>() + std::mem::size_of::<u32>();

/// Bytes a cached span of `len` bytes of text costs.
pub fn entry_bytes(len: usize) -> usize {
    ENTRY_OVERHEAD + len
}

const NIL: u32 = u32::MAX;

/// A least-recently-used map from span text to token count holding at most `max_bytes` of
/// [`entry_bytes`]. Entries live in a slab and link by index; evicted slots are reused.
#[derive(Debug)]
struct SpanCache {
    /// Slab indices, found by their entry's hash and text.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    /// Slots of evicted entries, reused before the slab grows.
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
    bytes: usize,
    max_bytes: usize,
}

impl SpanCache {
    fn new(max_bytes: usize) -> Self {
        Self {
            index: HashTable::new(),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            bytes: 0,
            max_bytes,
        }
    }

    fn find(&self, hash: u64, text: &str) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash, |&i| *entries[i as usize].text == *text)
            .copied()
    }

    /// The count cached for `text` (whose hash is `hash`), marking it recently used.
    fn get(&mut self, hash: u64, text: &str) -> Option<usize> {
        let i = self.find(hash, text)?;
        self.touch(i);
        Some(self.entries[i as usize].tokens)
    }

    /// Caches `text`'s count, evicting the least recently used spans to make room. A span
    /// bigger than the whole bound is not cached. Returns whether `text` is cached now.
    fn insert(&mut self, hash: u64, text: &str, tokens: usize) -> bool {
        if let Some(i) = self.find(hash, text) {
            self.entries[i as usize].tokens = tokens;
            self.touch(i);
            return true;
        }
        let cost = entry_bytes(text.len());
        if cost > self.max_bytes {
            return false;
        }
        while self.bytes + cost > self.max_bytes {
            self.evict(self.tail);
        }
        let entry = Entry {
            text: text.into(),
            hash,
            tokens,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i as usize] = entry;
                i
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        let entries = &self.entries;
        self.index
            .insert_unique(hash, i, |&j| entries[j as usize].hash);
        self.bytes += cost;
        self.push_front(i);
        true
    }

    fn evict(&mut self, i: u32) {
        self.unlink(i);
        let entry = &mut self.entries[i as usize];
        let text = std::mem::take(&mut entry.text);
        self.index
            .find_entry(entry.hash, |&j| j == i)
            .expect("every linked entry is indexed")
            .remove();
        self.bytes -= entry_bytes(text.len());
        self.free.push(i);
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn touch(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn unlink(&mut self, i: u32) {
        let Entry { prev, next, .. } = self.entries[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old_head = self.head;
        let entry = &mut self.entries[i as usize];
        entry.prev = NIL;
        entry.next = old_head;
        match old_head {
            NIL => self.tail = i,
            h => self.entries[h as usize].prev = i,
        }
        self.head = i;
    }
}

/// Most shards a cache is cut into.
const MAX_SHARDS: usize = 16;

/// Fewest bytes a shard holds: a smaller cache has fewer shards (one below twice this), so a
/// span up to this size always fits in its shard.
pub const MIN_SHARD_BYTES: usize = 4 << 20;

/// How many shards a cache of `max_bytes` is cut into: a power of two, at most
/// [`MAX_SHARDS`], each of at least [`MIN_SHARD_BYTES`] (one for smaller caches).
fn shard_count(max_bytes: usize) -> usize {
    let n = (max_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
    1 << n.ilog2()
}

/// Rendering a prompt to see what of it is cached is cheap up to this much text with the
/// built-in renderer (about 15 us), and up to [`INLINE_BYTES`] with a Jinja template.
const LOOK_UP_TEXT_BYTES: usize = 64 << 10;

/// Bytes of text in JSON values (strings and keys), or `None` once past `limit`.
fn text_bytes<'a>(values: impl IntoIterator<Item = &'a Value>, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    let mut stack: Vec<&Value> = values.into_iter().collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => total += s.len(),
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                for (k, v) in map {
                    total += k.len();
                    stack.push(v);
                }
            }
            // Numbers, booleans and null render in a few bytes.
            _ => total += 8,
        }
        if total > limit {
            return None;
        }
    }
    Some(total)
}

/// The conversation `[user, answer, user]` without a generation prompt, or `[user, user]`
/// without an answer.
fn probe(answer: Option<&str>) -> ChatPrompt {
    let user = json!({"role": "user", "content": "."});
    let messages = match answer {
        Some(text) => vec![
            user.clone(),
            json!({"role": "assistant", "content": text}),
            user,
        ],
        None => vec![user.clone(), user],
    };
    ChatPrompt {
        messages,
        tools: None,
        add_generation_prompt: false,
        ..ChatPrompt::default()
    }
}

/// Answer text a thread's [`REPLY_PROBE`] keeps the room for between answers.
const REPLY_PROBE_KEEP_BYTES: usize = 64 << 10;

/// The answer's text in a [`REPLY_PROBE`].
fn answer_text(probe: &mut ChatPrompt) -> &mut String {
    match probe.messages[1].get_mut("content") {
        Some(Value::String(text)) => text,
        _ => unreachable!("the probe's answer is a string"),
    }
}

thread_local! {
    /// The probe `[user, answer, user]` that [`ChatCounter::reply_span`] renders, one per
    /// thread: each answer only has its text put in place of the last one's, no conversation
    /// built and dropped per answer.
    static REPLY_PROBE: RefCell<ChatPrompt> = RefCell::new(probe(Some("")));
}

/// What [`ChatCounter::look_up`] found for a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookUp {
    /// Bytes of the rendering that counting would tokenize now (its spans not cached);
    /// `usize::MAX` for a prompt of more text than is cheap to render for this (64 KiB with the
    /// built-in renderer, [`INLINE_BYTES`] with a Jinja template); 0 for a prompt the template
    /// refuses (counting it fails at once).
    pub uncached: usize,
    /// The rendering, cut and hashed, for [`ChatCounter::count_prepared_up_to`] (`None` when
    /// not rendered).
    pub rendered: Option<Rendered>,
}

/// A rendered prompt with its spans cut and hashed ([`ChatCounter::prepare`]): counting it
/// after a look-up neither searches nor hashes the text again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    text: String,
    /// Each span's hash and where it ends in `text`, in order.
    spans: Vec<(u64, usize)>,
}

impl Rendered {
    /// The rendered text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Each span with its hash.
    fn spans(&self) -> impl Iterator<Item = (u64, &str)> {
        let mut start = 0;
        self.spans.iter().map(move |&(hash, end)| {
            let span = &self.text[start..end];
            start = end;
            (hash, span)
        })
    }
}

/// Counters of a [`ChatCounter`], per rendered span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Spans whose count came from the cache (`tokengate_tokenize_cache_hits_total`).
    pub hits: u64,
    /// Spans that had to be tokenized (`tokengate_tokenize_cache_misses_total`).
    pub misses: u64,
    /// Answers counted ahead for their conversation's next turn
    /// (`tokengate_tokenize_cache_replies_total`).
    pub replies: u64,
    /// Spans cached now.
    pub entries: usize,
    /// Bytes the cached spans hold now, at most the configured bound.
    pub bytes: usize,
}

/// Counts chat prompts through a template with per-span memoization. Shared by the tokenizer
/// worker threads; use one per tokenizer (the cache does not key on the tokenizer).
#[derive(Debug)]
pub struct ChatCounter {
    template: ChatTemplate,
    /// [`probe`] without an answer, rendered: what [`ChatCounter::remember_reply`] compares with
    /// (`None` if the template refuses it).
    reply_probe: Option<String>,
    hasher: foldhash::fast::RandomState,
    /// The shards, a power of two of them; a span lives in the one its hash picks.
    shards: Box<[Mutex<SpanCache>]>,
    hits: AtomicU64,
    misses: AtomicU64,
    replies: AtomicU64,
}

impl ChatCounter {
    /// A counter rendering with `template` whose cache holds at most `max_bytes` (0 disables
    /// memoization), in shards of at least [`MIN_SHARD_BYTES`].
    pub fn new(template: ChatTemplate, max_bytes: usize) -> Self {
        let shards = shard_count(max_bytes);
        Self {
            reply_probe: template.render(&probe(None)).ok(),
            template,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..shards)
                .map(|_| Mutex::new(SpanCache::new(max_bytes / shards)))
                .collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            replies: AtomicU64::new(0),
        }
    }

    /// The template prompts are rendered with.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The prompt's token count: exactly `tok.count(&template.render(prompt))`, tokenizing only
    /// the spans not seen recently. The lock is never held while hashing or tokenizing.
    pub fn count(
        &self,
        tok: &(impl CountTokens + ?Sized),
        prompt: &ChatPrompt,
    ) -> Result<usize, TemplateError> {
        Ok(self.count_up_to(tok, prompt, usize::MAX)?.tokens())
    }

    /// [`ChatCounter::count`] against `ceiling`: the cached spans are added up first, then the
    /// others are tokenized in order, each only up to what is left of the ceiling, and counting
    /// stops as soon as the total passes it. The spans counted to their end are cached; the
    /// one cut short and those after it are not.
    pub fn count_up_to(
        &self,
        tok: &(impl CountTokens + ?Sized),
        prompt: &ChatPrompt,
        ceiling: usize,
    ) -> Result<TokenCount, TemplateError> {
        let text = self.template.render(prompt)?;
        Ok(self.count_rendered_up_to(tok, &text, ceiling))
    }

    /// [`ChatCounter::count_up_to`] of a prompt already rendered (`text`, from
    /// [`ChatCounter::look_up`]).
    pub fn count_rendered_up_to(
        &self,
        tok: &(impl CountTokens + ?Sized),
        text: &str,
        ceiling: usize,
    ) -> TokenCount {
        let spans: Vec<(u64, &str)> = spans(text).map(|s| (self.hasher.hash_one(s), s)).collect();
        self.count_spans(tok, &spans, ceiling)
    }

    /// [`ChatCounter::count_rendered_up_to`] of a rendering already cut and hashed.
    pub fn count_prepared_up_to(
        &self,
        tok: &(impl CountTokens + ?Sized),
        rendered: &Rendered,
        ceiling: usize,
    ) -> TokenCount {
        let spans: Vec<(u64, &str)> = rendered.spans().collect();
        self.count_spans(tok, &spans, ceiling)
    }

    /// `text` cut into its spans, each hashed as the cache keys it.
    pub fn prepare(&self, text: String) -> Rendered {
        let mut end = 0;
        let spans = spans(&text)
            .map(|span| {
                end += span.len();
                (self.hasher.hash_one(span), end)
            })
            .collect();
        Rendered { text, spans }
    }

    /// The count of a rendering's spans (with their hashes) against `ceiling`: see
    /// [`ChatCounter::count_up_to`].
    fn count_spans(
        &self,
        tok: &(impl CountTokens + ?Sized),
        spans: &[(u64, &str)],
        ceiling: usize,
    ) -> TokenCount {
        let mut total = 0;
        let mut missing = Vec::new();
        for &(hash, span) in spans {
            match self.shard(hash).get(hash, span) {
                Some(tokens) => total += tokens,
                None => missing.push((hash, span, 0)),
            }
        }
        self.hits
            .fetch_add((spans.len() - missing.len()) as u64, Ordering::Relaxed);
        // Missing spans handed to the tokenizer, and those of them counted to their end.
        let (mut tokenized, mut counted) = (0u64, 0usize);
        for (_, span, tokens) in &mut missing {
            if total > ceiling {
                break;
            }
            tokenized += 1;
            match tok.count_up_to(span, ceiling - total) {
                TokenCount::Exact(n) => {
                    *tokens = n;
                    counted += 1;
                    total += n;
                }
                TokenCount::AtLeast(n) => total += n,
            }
        }
        self.misses.fetch_add(tokenized, Ordering::Relaxed);
        for &(hash, span, tokens) in &missing[..counted] {
            self.shard(hash).insert(hash, span, tokens);
        }
        TokenCount::of(total, ceiling)
    }

    /// The prompt rendered and looked up in the cache, to decide where to count it (and count
    /// it there without rendering it again): see [`LookUp`]. Touches neither recency nor the
    /// counters.
    pub fn look_up(&self, prompt: &ChatPrompt) -> LookUp {
        let limit = if self.template.is_builtin() {
            LOOK_UP_TEXT_BYTES
        } else {
            INLINE_BYTES
        };
        let values = prompt.messages.iter().chain(prompt.tools.iter().flatten());
        if text_bytes(values, limit).is_none() {
            return LookUp {
                uncached: usize::MAX,
                rendered: None,
            };
        }
        let Ok(text) = self.template.render(prompt) else {
            return LookUp {
                uncached: 0,
                rendered: None,
            };
        };
        let rendered = self.prepare(text);
        let uncached = rendered
            .spans()
            .filter(|&(hash, span)| self.shard(hash).find(hash, span).is_none())
            .map(|(_, span)| span.len())
            .sum();
        LookUp {
            uncached,
            rendered: Some(rendered),
        }
    }

    /// Counts ahead the span an assistant answer whose text is `content` will have in the
    /// history of its conversation's next request, and caches it: that request then tokenizes
    /// only its new user message. The gateway calls this off the request path once a chat answer
    /// has come back whole. Returns whether the span is cached now.
    ///
    /// Always exact, because the cache maps a span's text to that text's count: if the client
    /// sends the answer back changed, or the template renders it differently in the real
    /// conversation than here, the next request simply finds no entry and counts the span.
    pub fn remember_reply(&self, tok: &(impl CountTokens + ?Sized), content: &str) -> bool {
        let Some(span) = self.reply_span(content) else {
            return false;
        };
        let hash = self.hasher.hash_one(span.as_str());
        let cached = self.shard(hash).get(hash, &span).is_some() || {
            let tokens = tok.count(&span);
            self.shard(hash).insert(hash, &span, tokens)
        };
        if cached {
            self.replies.fetch_add(1, Ordering::Relaxed);
        }
        cached
    }

    /// The span of an assistant answer in the history, before a later question: what the
    /// conversation [user, answer, user] renders and [user, user] does not. `None` when the
    /// template does not render the answer as exactly one span of its own.
    fn reply_span(&self, content: &str) -> Option<String> {
        let without = self.reply_probe.as_deref()?;
        let with = REPLY_PROBE
            .with_borrow_mut(|probe| {
                let text = answer_text(probe);
                // Cleared before as well as after: a render that panicked left its text.
                text.clear();
                text.push_str(content);
                let rendered = self.template.render(probe);
                let text = answer_text(probe);
                text.clear();
                text.shrink_to(REPLY_PROBE_KEEP_BYTES);
                rendered
            })
            .ok()?;
        let with: Vec<&str> = spans(&with).collect();
        let without: Vec<&str> = spans(without).collect();
        if with.len() != without.len() + 1 {
            return None;
        }
        let same_start = with
            .iter()
            .zip(&without)
            .take_while(|(a, b)| a == b)
            .count();
        let same_end = (with.iter().rev().zip(without.iter().rev()))
            .take_while(|(a, b)| a == b)
            .count();
        (same_start + same_end >= without.len()).then(|| with[same_start].to_owned())
    }

    /// Hit and miss counters and the cache's current size (all shards).
    pub fn stats(&self) -> CacheStats {
        let (mut entries, mut bytes) = (0, 0);
        for shard in &self.shards {
            let shard = lock(shard);
            entries += shard.len();
            bytes += shard.bytes;
        }
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            replies: self.replies.load(Ordering::Relaxed),
            entries,
            bytes,
        }
    }

    /// The locked shard a span of hash `hash` lives in. Bits 32 and up pick it: the hash
    /// table inside uses the low bits for its buckets and the top 7 as tags.
    fn shard(&self, hash: u64) -> MutexGuard<'_, SpanCache> {
        lock(&self.shards[(hash >> 32) as usize & (self.shards.len() - 1)])
    }
}

fn lock(shard: &Mutex<SpanCache>) -> MutexGuard<'_, SpanCache> {
    // The cache's methods do not panic midway, so a poisoned lock still guards a consistent
    // cache; carrying on beats failing every later request.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// Counts characters and records what it was asked to count.
    #[derive(Default)]
    struct CharCounter {
        seen: RefCell<Vec<String>>,
    }

    impl CountTokens for CharCounter {
        fn count(&self, text: &str) -> usize {
            self.seen.borrow_mut().push(text.to_owned());
            text.chars().count()
        }

        /// Reads no more characters than the ceiling needs, as the tokenizer does.
        fn count_up_to(&self, text: &str, ceiling: usize) -> TokenCount {
            self.seen.borrow_mut().push(text.to_owned());
            let read = text.chars().take(ceiling.saturating_add(1)).count();
            TokenCount::of(read, ceiling)
        }
    }

    fn turn(n: usize) -> ChatPrompt {
        let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
        for i in 0..n {
            if i > 0 {
                messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
            }
            messages.push(json!({"role": "user", "content": format!("question {}", i + 1)}));
        }
        ChatPrompt {
            messages,
            tools: None,
            add_generation_prompt: true,
            ..ChatPrompt::default()
        }
    }

    #[test]
    fn follow_up_turn_tokenizes_only_new_spans() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let tok = CharCounter::default();
        let whole = |p: &ChatPrompt| counter.template().render(p).unwrap().chars().count();

        let bytes = |p: &ChatPrompt| -> usize {
            let text = counter.template().render(p).unwrap();
            spans(&text).map(|s| entry_bytes(s.len())).sum()
        };

        assert_eq!(counter.count(&tok, &turn(1)).unwrap(), whole(&turn(1)));
        // system, user 1, generation prompt
        assert_eq!(
            counter.stats(),
            CacheStats {
                hits: 0,
                misses: 3,
                replies: 0,
                entries: 3,
                bytes: bytes(&turn(1))
            }
        );

        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &turn(2)).unwrap(), whole(&turn(2)));
        assert_eq!(
            *tok.seen.borrow(),
            [
                "<|im_start|>assistant\nanswer 1<|im_end|>\n",
                "<|im_start|>user\nquestion 2<|im_end|>\n",
            ]
        );
        assert_eq!(
            counter.stats(),
            CacheStats {
                hits: 3,
                misses: 5,
                replies: 0,
                entries: 5,
                bytes: bytes(&turn(2))
            }
        );

        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &turn(2)).unwrap(), whole(&turn(2)));
        assert!(tok.seen.borrow().is_empty());
        assert_eq!(counter.stats().hits, 8);
    }

    #[test]
    fn counting_with_a_ceiling_stops_in_the_span_that_passes_it_and_caches_the_whole_ones() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let tok = CharCounter::default();
        let spans_of = |p: &ChatPrompt| counter.template().render_spans(p).unwrap();
        let chars = |s: &str| s.chars().count();
        // system, question 1 and the generation prompt are cached.
        let first = counter.count(&tok, &turn(1)).unwrap();
        let second = spans_of(&turn(2));
        let [_, _, answer, question, _] = &second[..] else {
            panic!("turn 2 has five spans: {second:?}");
        };
        let whole = chars(&second.concat());
        assert_eq!(
            counter.count_up_to(&tok, &turn(1), first),
            Ok(TokenCount::Exact(first))
        );
        tok.seen.borrow_mut().clear();

        // Room for the cached spans, the answer and 2 characters of the question.
        let ceiling = first + chars(answer) + 2;
        assert_eq!(
            counter.count_up_to(&tok, &turn(2), ceiling),
            Ok(TokenCount::AtLeast(ceiling + 1))
        );
        assert_eq!(*tok.seen.borrow(), [answer.clone(), question.clone()]);
        // The answer, counted to its end, is cached; the question cut short is not.
        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &turn(2)).unwrap(), whole);
        assert_eq!(*tok.seen.borrow(), std::slice::from_ref(question));

        // The cached spans alone pass the ceiling: nothing is tokenized.
        tok.seen.borrow_mut().clear();
        assert_eq!(
            counter.count_up_to(&tok, &turn(2), 10),
            Ok(TokenCount::AtLeast(whole))
        );
        assert!(tok.seen.borrow().is_empty());
    }

    #[test]
    fn an_answer_counted_ahead_leaves_only_the_new_question() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let tok = CharCounter::default();
        let whole = |p: &ChatPrompt| counter.template().render(p).unwrap().chars().count();
        counter.count(&tok, &turn(1)).unwrap();
        tok.seen.borrow_mut().clear();

        assert!(counter.remember_reply(&tok, "answer 1"));
        assert_eq!(
            *tok.seen.borrow(),
            ["<|im_start|>assistant\nanswer 1<|im_end|>\n"]
        );
        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &turn(2)).unwrap(), whole(&turn(2)));
        assert_eq!(
            *tok.seen.borrow(),
            ["<|im_start|>user\nquestion 2<|im_end|>\n"]
        );
        assert_eq!(counter.stats().replies, 1);

        // An answer with its reasoning inline: the history keeps only the text after it, as
        // the template renders an earlier turn.
        let mut next = turn(2);
        let thinking = "<think>\nweigh it\n</think>\n\nanswer 2";
        next.messages
            .push(json!({"role": "assistant", "content": thinking}));
        next.messages
            .push(json!({"role": "user", "content": "question 3"}));
        assert!(counter.remember_reply(&tok, thinking));
        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &next).unwrap(), whole(&next));
        assert_eq!(
            *tok.seen.borrow(),
            ["<|im_start|>user\nquestion 3<|im_end|>\n"]
        );
        assert_eq!(counter.stats().replies, 2);
    }

    #[test]
    fn an_answer_too_big_for_the_cache_is_not_counted_as_remembered() {
        let span = "<|im_start|>assistant\nanswer 1<|im_end|>\n";
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), entry_bytes(span.len()) - 1);
        let tok = CharCounter::default();
        assert!(!counter.remember_reply(&tok, "answer 1"));
        assert_eq!(*tok.seen.borrow(), [span]);
        assert_eq!((counter.stats().replies, counter.stats().entries), (0, 0));
        let fits = ChatCounter::new(ChatTemplate::builtin_qwen35(), entry_bytes(span.len()));
        assert!(fits.remember_reply(&tok, "answer 1"));
        assert_eq!((fits.stats().replies, fits.stats().entries), (1, 1));
    }

    #[test]
    fn an_answer_the_template_does_not_render_alone_is_not_remembered() {
        let only_users = "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n\
                          {{ m.content }}<|im_end|>\n{% endif %}{% endfor %}";
        let template = ChatTemplate::from_jinja_source(only_users.to_owned()).unwrap();
        let counter = ChatCounter::new(template, 1 << 20);
        let tok = CharCounter::default();
        assert!(!counter.remember_reply(&tok, "answer 1"));
        assert!(tok.seen.borrow().is_empty());
        assert_eq!(
            counter.stats(),
            CacheStats {
                hits: 0,
                misses: 0,
                replies: 0,
                entries: 0,
                bytes: 0
            }
        );
    }

    #[test]
    fn shards_split_the_bound_and_small_caches_keep_one() {
        assert_eq!(shard_count(0), 1);
        assert_eq!(shard_count(2 * MIN_SHARD_BYTES - 1), 1);
        assert_eq!(shard_count(3 * MIN_SHARD_BYTES), 2);
        assert_eq!(shard_count(64 << 20), 16);
        assert_eq!(shard_count(1 << 40), MAX_SHARDS);

        // Many distinct spans in a 16-shard cache of 64 MiB: every one found again, and the
        // bound held with room to spare.
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 64 << 20);
        assert_eq!(counter.shards.len(), 16);
        let tok = SyncCharCounter;
        let want: Vec<usize> = (1..=40)
            .map(|n| counter.template().render(&turn(n)).unwrap().chars().count())
            .collect();
        for (n, want) in (1..=40).zip(&want) {
            assert_eq!(counter.count(&tok, &turn(n)).unwrap(), *want);
        }
        let before = counter.stats();
        // system, 40 questions, 39 answers, generation prompt
        assert_eq!(before.entries, 81);
        for (n, want) in (1..=40).zip(&want) {
            assert_eq!(counter.count(&tok, &turn(n)).unwrap(), *want);
        }
        let after = counter.stats();
        assert_eq!(after.misses, before.misses, "every span was a hit");
        assert_eq!((after.entries, after.bytes), (before.entries, before.bytes));
        let used: Vec<usize> = counter.shards.iter().map(|s| lock(s).len()).collect();
        assert!(used.iter().filter(|&&n| n > 0).count() > 1, "{used:?}");
    }

    #[test]
    fn a_look_up_renders_once_and_finds_the_spans_counting_would_tokenize() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let uncached = |p: &ChatPrompt| counter.look_up(p).uncached;
        let tok = CharCounter::default();
        let rendered = |p: &ChatPrompt| counter.template().render(p).unwrap();
        let look = counter.look_up(&turn(1));
        assert_eq!(look.uncached, rendered(&turn(1)).len());
        assert_eq!(look.rendered, Some(counter.prepare(rendered(&turn(1)))));
        // Counted from its rendering, as from the prompt.
        let again = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let text = rendered(&turn(2));
        assert_eq!(
            again.count_rendered_up_to(&tok, &text, usize::MAX),
            TokenCount::Exact(text.chars().count())
        );
        // And from its rendering cut and hashed, as from the text: the same count and spans
        // cached (the second count finds every span).
        let prepared = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let cut = prepared.prepare(text.clone());
        assert_eq!(cut.text(), text);
        assert_eq!(
            prepared.count_prepared_up_to(&tok, &cut, usize::MAX),
            TokenCount::Exact(text.chars().count())
        );
        assert_eq!(
            prepared.count_rendered_up_to(&tok, &text, usize::MAX),
            TokenCount::Exact(text.chars().count())
        );
        assert_eq!(prepared.stats().misses, again.stats().misses);
        assert_eq!(prepared.stats().hits, again.stats().misses);
        counter.count(&tok, &turn(1)).unwrap();
        assert_eq!(uncached(&turn(1)), 0);
        let answer_and_question = "<|im_start|>assistant\nanswer 1<|im_end|>\n\
                                   <|im_start|>user\nquestion 2<|im_end|>\n";
        assert_eq!(uncached(&turn(2)), answer_and_question.len());
        // Looking touches no counter.
        assert_eq!((counter.stats().hits, counter.stats().misses), (0, 3));

        // Too much text to render for a look: as if nothing were cached.
        let mut long = turn(1);
        long.messages
            .push(json!({"role": "user", "content": "x".repeat(LOOK_UP_TEXT_BYTES)}));
        assert_eq!(
            counter.look_up(&long),
            LookUp {
                uncached: usize::MAX,
                rendered: None
            }
        );
        // A prompt the template refuses fails at once wherever it is counted.
        let mut empty = turn(1);
        empty.messages.clear();
        assert_eq!(
            counter.look_up(&empty),
            LookUp {
                uncached: 0,
                rendered: None
            }
        );
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn entry_overhead_is_what_the_readme_says() {
        assert_eq!(ENTRY_OVERHEAD, 44);
    }

    #[test]
    fn counts_through_a_trait_object() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let tok: std::sync::Arc<dyn CountTokens + Send + Sync> =
            std::sync::Arc::new(SyncCharCounter);
        let want = counter.template().render(&turn(2)).unwrap().chars().count();
        assert_eq!(counter.count(tok.as_ref(), &turn(2)).unwrap(), want);
    }

    #[test]
    fn zero_bytes_disables_memoization() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 0);
        let tok = CharCounter::default();
        // system, 3 questions, 2 answers, generation prompt: 7 spans, twice.
        let a = counter.count(&tok, &turn(3)).unwrap();
        assert_eq!(counter.count(&tok, &turn(3)).unwrap(), a);
        assert_eq!(
            counter.stats(),
            CacheStats {
                hits: 0,
                misses: 14,
                replies: 0,
                entries: 0,
                bytes: 0
            }
        );
    }

    #[test]
    fn template_errors_pass_through_without_counting() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let mut p = turn(1);
        p.messages.clear();
        assert_eq!(
            counter.count(&CharCounter::default(), &p),
            Err(TemplateError::Rejected("No messages provided.".into()))
        );
        assert_eq!(counter.stats().misses, 0);
    }

    /// Counts characters; shareable across threads like the real tokenizer.
    struct SyncCharCounter;

    impl CountTokens for SyncCharCounter {
        fn count(&self, text: &str) -> usize {
            text.chars().count()
        }
    }

    #[test]
    fn shared_by_worker_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatCounter>();
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let expected: Vec<usize> = (1..=8)
            .map(|n| counter.template().render(&turn(n)).unwrap().chars().count())
            .collect();
        std::thread::scope(|scope| {
            for worker in 0..4 {
                let (counter, expected) = (&counter, &expected);
                scope.spawn(move || {
                    for round in 0..50 {
                        let n = (worker + round) % 8 + 1;
                        let got = counter.count(&SyncCharCounter, &turn(n)).unwrap();
                        assert_eq!(got, expected[n - 1]);
                    }
                });
            }
        });
        let stats = counter.stats();
        // turn(n) has 2n + 1 spans; each worker counted 50 prompts.
        let spans: u64 = (0..4)
            .flat_map(|w| (0..50).map(move |r| 2 * ((w + r) % 8 + 1) as u64 + 1))
            .sum();
        assert_eq!(stats.hits + stats.misses, spans);
        // Distinct spans: system, 8 questions, 7 answers, generation prompt.
        assert_eq!(stats.entries, 17);
        assert!(stats.misses >= 17);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u8),
        Insert(u8, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(|k| Op::Get(k % 24)),
            (any::<u8>(), 0usize..1000).prop_map(|(k, n)| Op::Insert(k % 24, n)),
        ]
    }

    /// Span `k`'s text: 0 to 40 bytes long, so entries differ in size.
    fn text(k: u8) -> String {
        "x".repeat(usize::from(k) * 5 % 41) + &k.to_string()
    }

    /// A deliberately poor hash: the 24 spans share 3 values, so hits must be told apart by
    /// their text.
    fn hash(k: u8) -> u64 {
        u64::from(k % 3)
    }

    proptest! {
        /// The cache never holds more bytes than its bound, never confuses two texts with the
        /// same hash, and behaves exactly like a plain LRU list that drops its oldest entries
        /// until the new one fits.
        #[test]
        fn cache_stays_within_bytes_and_is_lru(
            max_bytes in 0usize..(8 * entry_bytes(40)),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut cache = SpanCache::new(max_bytes);
            // Most recent first.
            let mut model: VecDeque<(u8, usize)> = VecDeque::new();
            let size = |k: u8| entry_bytes(text(k).len());
            for op in ops {
                match op {
                    Op::Get(k) => {
                        let want = model.iter().position(|e| e.0 == k).map(|i| {
                            let e = model.remove(i).unwrap();
                            model.push_front(e);
                            e.1
                        });
                        prop_assert_eq!(cache.get(hash(k), &text(k)), want);
                    }
                    Op::Insert(k, n) => {
                        cache.insert(hash(k), &text(k), n);
                        if let Some(i) = model.iter().position(|e| e.0 == k) {
                            model.remove(i);
                            model.push_front((k, n));
                        } else if size(k) <= max_bytes {
                            while model.iter().map(|e| size(e.0)).sum::<usize>() + size(k)
                                > max_bytes
                            {
                                model.pop_back();
                            }
                            model.push_front((k, n));
                        }
                    }
                }
                let model_bytes: usize = model.iter().map(|e| size(e.0)).sum();
                prop_assert!(cache.bytes <= max_bytes);
                prop_assert_eq!(cache.bytes, model_bytes);
                prop_assert_eq!(cache.len(), model.len());
                prop_assert_eq!(
                    cache.entries.len() - cache.free.len(),
                    model.len(),
                    "evicted slots are reused"
                );
            }
        }
    }
}
