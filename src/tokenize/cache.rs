//! Memoized chat counting (tokenize room): multi-turn clients resend the whole history every
//! turn, so the rendered prompt is cut into turn spans (see [`crate::tokenize::chat::spans`])
//! and each span's token count is remembered under a hash of its text in a cache bounded in
//! bytes. A follow-up turn tokenizes only what is new; the rest is looked up.

use super::chat::{spans, ChatPrompt, ChatTemplate, CountTokens, TemplateError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// A span's identity: the first 128 bits of the SHA-256 of its text.
///
/// Why collisions are not a concern: by the birthday bound, even 10^9 distinct spans collide
/// with probability about 10^18 / 2^129, i.e. below 10^-20; and SHA-256 being collision
/// resistant, a client cannot craft two texts with the same key to borrow another text's count.
type Key = u128;

/// The cache's bookkeeping for one entry: its key, count and recency links.
#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    tokens: usize,
    prev: u32,
    next: u32,
}

/// Bytes one cached span costs: its node plus its slot in the key index (the hash table's spare
/// capacity is not counted).
pub const ENTRY_BYTES: usize = std::mem::size_of::<Node>() + std::mem::size_of::<(Key, u32)>();

const NIL: u32 = u32::MAX;

/// A least-recently-used map from span key to token count holding at most
/// `max_bytes / ENTRY_BYTES` entries. Nodes live in a slab and link by index.
#[derive(Debug)]
struct SpanCache {
    index: HashMap<Key, u32>,
    nodes: Vec<Node>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
    capacity: usize,
}

impl SpanCache {
    fn new(max_bytes: usize) -> Self {
        Self {
            index: HashMap::new(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity: (max_bytes / ENTRY_BYTES).min(NIL as usize),
        }
    }

    fn get(&mut self, key: Key) -> Option<usize> {
        let i = *self.index.get(&key)?;
        self.touch(i);
        Some(self.nodes[i as usize].tokens)
    }

    fn insert(&mut self, key: Key, tokens: usize) {
        if let Some(&i) = self.index.get(&key) {
            self.nodes[i as usize].tokens = tokens;
            self.touch(i);
            return;
        }
        if self.capacity == 0 {
            return;
        }
        let i = if self.nodes.len() < self.capacity {
            self.nodes.push(Node {
                key,
                tokens,
                prev: NIL,
                next: NIL,
            });
            (self.nodes.len() - 1) as u32
        } else {
            // Full: the least recently used entry's node is reused for the new one.
            let i = self.tail;
            self.unlink(i);
            let node = &mut self.nodes[i as usize];
            self.index.remove(&node.key);
            node.key = key;
            node.tokens = tokens;
            i
        };
        self.index.insert(key, i);
        self.push_front(i);
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn bytes(&self) -> usize {
        self.len() * ENTRY_BYTES
    }

    fn touch(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old_head = self.head;
        let node = &mut self.nodes[i as usize];
        node.prev = NIL;
        node.next = old_head;
        match old_head {
            NIL => self.tail = i,
            h => self.nodes[h as usize].prev = i,
        }
        self.head = i;
    }
}

/// Counters of a [`ChatCounter`], per rendered span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Spans whose count came from the cache (`tokengate_tokenize_cache_hits_total`).
    pub hits: u64,
    /// Spans that had to be tokenized (`tokengate_tokenize_cache_misses_total`).
    pub misses: u64,
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
    cache: Mutex<SpanCache>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl ChatCounter {
    /// A counter rendering with `template` whose cache holds at most `max_bytes` (0 disables
    /// memoization).
    pub fn new(template: ChatTemplate, max_bytes: usize) -> Self {
        Self {
            template,
            cache: Mutex::new(SpanCache::new(max_bytes)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The template prompts are rendered with.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The prompt's token count: exactly `tok.count(&template.render(prompt))`, tokenizing only
    /// the spans not seen recently. The lock is never held while tokenizing.
    pub fn count(
        &self,
        tok: &(impl CountTokens + ?Sized),
        prompt: &ChatPrompt,
    ) -> Result<usize, TemplateError> {
        let text = self.template.render(prompt)?;
        let spans: Vec<(Key, &str)> = spans(&text).map(|s| (span_key(s), s)).collect();
        let mut total = 0;
        let mut missing = Vec::new();
        {
            let mut cache = self.lock();
            for &(key, span) in &spans {
                match cache.get(key) {
                    Some(tokens) => total += tokens,
                    None => missing.push((key, span)),
                }
            }
        }
        self.hits
            .fetch_add((spans.len() - missing.len()) as u64, Ordering::Relaxed);
        self.misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        if missing.is_empty() {
            return Ok(total);
        }
        let counted: Vec<(Key, usize)> = missing
            .into_iter()
            .map(|(key, span)| (key, tok.count(span)))
            .collect();
        total += counted.iter().map(|&(_, tokens)| tokens).sum::<usize>();
        let mut cache = self.lock();
        for (key, tokens) in counted {
            cache.insert(key, tokens);
        }
        Ok(total)
    }

    /// Hit and miss counters and the cache's current size.
    pub fn stats(&self) -> CacheStats {
        let cache = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: cache.len(),
            bytes: cache.bytes(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpanCache> {
        // The cache's methods do not panic midway, so a poisoned lock still guards a consistent
        // cache; carrying on beats failing every later request.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn span_key(span: &str) -> Key {
    let digest = Sha256::digest(span.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(first)
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
            enable_thinking: None,
        }
    }

    #[test]
    fn follow_up_turn_tokenizes_only_new_spans() {
        let counter = ChatCounter::new(ChatTemplate::builtin_qwen35(), 1 << 20);
        let tok = CharCounter::default();
        let whole = |p: &ChatPrompt| counter.template().render(p).unwrap().chars().count();

        assert_eq!(counter.count(&tok, &turn(1)).unwrap(), whole(&turn(1)));
        // system, user 1, generation prompt
        assert_eq!(
            counter.stats(),
            CacheStats {
                hits: 0,
                misses: 3,
                entries: 3,
                bytes: 3 * ENTRY_BYTES
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
                entries: 5,
                bytes: 5 * ENTRY_BYTES
            }
        );

        tok.seen.borrow_mut().clear();
        assert_eq!(counter.count(&tok, &turn(2)).unwrap(), whole(&turn(2)));
        assert!(tok.seen.borrow().is_empty());
        assert_eq!(counter.stats().hits, 8);
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

    proptest! {
        /// The cache never holds more bytes than its bound and behaves exactly like a plain
        /// LRU list of `max_bytes / ENTRY_BYTES` entries.
        #[test]
        fn cache_stays_within_bytes_and_is_lru(
            max_bytes in 0usize..(20 * ENTRY_BYTES),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut cache = SpanCache::new(max_bytes);
            let capacity = max_bytes / ENTRY_BYTES;
            // Most recent first.
            let mut model: VecDeque<(Key, usize)> = VecDeque::new();
            for op in ops {
                match op {
                    Op::Get(k) => {
                        let key = Key::from(k);
                        let want = model.iter().position(|e| e.0 == key).map(|i| {
                            let e = model.remove(i).unwrap();
                            model.push_front(e);
                            e.1
                        });
                        prop_assert_eq!(cache.get(key), want);
                    }
                    Op::Insert(k, n) => {
                        let key = Key::from(k);
                        cache.insert(key, n);
                        if let Some(i) = model.iter().position(|e| e.0 == key) {
                            model.remove(i);
                            model.push_front((key, n));
                        } else if capacity > 0 {
                            if model.len() == capacity {
                                model.pop_back();
                            }
                            model.push_front((key, n));
                        }
                    }
                }
                prop_assert!(cache.bytes() <= max_bytes);
                prop_assert_eq!(cache.len(), model.len());
                prop_assert_eq!(cache.index.len(), model.len());
            }
        }
    }
}
