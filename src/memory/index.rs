//! One tenant's memory in RAM: an inverted index scored with BM25, and
//! what the quota and the listings need (sizes, namespaces, expiry).
//!
//! [`super::Memory`] ──put / delete / sweep──▶ [`TenantIndex::upsert`] / [`TenantIndex::remove`]
//! [`super::Memory`] ──search──▶ [`TenantIndex::ranked`] ──▶ the keys, best first (the values are read from the store)
//!
//! Pure: no IO, no clock (the caller passes `now`). Values are not held
//! here, only their terms, so the index of a tenant costs its vocabulary
//! and a few dozen bytes per item, whatever the items' size.
//!
//! Decided:
//! - **Tokens**: lower-cased runs of letters and digits (Unicode), one
//!   character runs dropped, a trailing `'s` dropped with the apostrophe
//!   (`dog's` is `dog`), an English plural folded (`deploys` is `deploy`,
//!   `stories` is `story`: a query and a note rarely agree on number); no
//!   other stemming, no stop words (BM25's IDF makes `the` and `is` worth
//!   almost nothing).
//! - **BM25** with k1 = 1.2 and b = 0.75 (Lucene's defaults), IDF
//!   `ln(1 + (N - n + 0.5) / (n + 0.5))` (never negative), over the
//!   tenant's live items whatever the namespace prefix searched: a term's
//!   rarity is the tenant's.
//! - Postings are a map per term (item -> term frequency), so replacing
//!   or deleting an item is O(its distinct terms), not O(a posting list).

use std::collections::{BTreeSet, HashMap};

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Reciprocal rank fusion's constant ([`super::embed`] says why).
const RRF_K: f64 = 60.0;

/// A query's vector and the least cosine an item needs to be ranked by it.
#[derive(Debug, Clone, Copy)]
pub struct Semantic<'a> {
    pub vector: &'a [f32],
    pub min_similarity: f32,
}

/// The terms of `text` ([`self`] says how it is cut).
pub fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars().peekable();
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if word.chars().count() > 1 {
            out.push(plural_dropped(std::mem::take(word)));
        } else {
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
        } else {
            // `dog's`: the word ends here and the `s` is dropped.
            if (c == '\'' || c == '’')
                && chars.peek().is_some_and(|n| *n == 's' || *n == 'S')
                && !word.is_empty()
            {
                chars.next();
                if chars.peek().is_some_and(|n| n.is_alphanumeric()) {
                    word.push('s');
                    continue;
                }
            }
            flush(&mut word, &mut out);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// `stories` is `story`, `deploys` is `deploy`; `class`, `is` and `bus`
/// stay (a plural `s` only after more than three letters, not after `s`).
fn plural_dropped(mut word: String) -> String {
    let n = word.chars().count();
    if n > 4 && word.ends_with("ies") {
        word.truncate(word.len() - 3);
        word.push('y');
    } else if n > 3 && word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") {
        word.pop();
    }
    word
}

/// What the index keeps of one item.
#[derive(Debug, Clone)]
pub struct Entry {
    pub namespace: Vec<String>,
    pub key: String,
    /// Stored bytes (what the quota counts).
    pub bytes: u64,
    /// Milliseconds since the epoch; `None`: never expires.
    pub expires_at: Option<i64>,
    /// Milliseconds since the epoch: orders a search without a query.
    pub updated_at: i64,
    /// Its distinct terms, each with its count, and how many terms in all.
    terms: Vec<(String, u32)>,
    len: u32,
    /// Its unit vector, when semantic ranking is on and it has one
    /// ([`super::embed`]).
    pub vector: Option<std::sync::Arc<[f32]>>,
}

impl Entry {
    pub fn new(
        namespace: Vec<String>,
        key: String,
        text: &str,
        bytes: u64,
        expires_at: Option<i64>,
        updated_at: i64,
    ) -> Entry {
        let all = tokens(text);
        let mut counts: HashMap<String, u32> = HashMap::new();
        for t in &all {
            *counts.entry(t.clone()).or_default() += 1;
        }
        Entry {
            namespace,
            key,
            bytes,
            expires_at,
            updated_at,
            terms: counts.into_iter().collect(),
            len: all.len() as u32,
            vector: None,
        }
    }

    pub fn expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }
}

/// Whether `namespace` starts with `prefix`, segment by segment.
pub fn under(namespace: &[String], prefix: &[String]) -> bool {
    namespace.len() >= prefix.len() && namespace.iter().zip(prefix).all(|(a, b)| a == b)
}

/// A tenant's items, by their store key.
#[derive(Debug, Default)]
pub struct TenantIndex {
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    by_key: HashMap<String, u32>,
    postings: HashMap<String, HashMap<u32, u32>>,
    total_len: u64,
    bytes: u64,
    /// Cluster mode: the stamp of the last write this index has seen.
    pub stamp: Option<String>,
}

impl TenantIndex {
    /// How many items, and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        (self.by_key.len(), self.bytes)
    }

    pub fn get(&self, store_key: &str) -> Option<&Entry> {
        self.by_key
            .get(store_key)
            .and_then(|&i| self.slots[i as usize].as_ref())
    }

    /// Adds or replaces the item under `store_key`.
    pub fn upsert(&mut self, store_key: &str, entry: Entry) {
        self.remove(store_key);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        for (term, n) in &entry.terms {
            self.postings
                .entry(term.clone())
                .or_default()
                .insert(id, *n);
        }
        self.total_len += u64::from(entry.len);
        self.bytes += entry.bytes;
        self.slots[id as usize] = Some(entry);
        self.by_key.insert(store_key.to_string(), id);
    }

    /// Removes the item under `store_key`; whether it was there.
    pub fn remove(&mut self, store_key: &str) -> Option<Entry> {
        let id = self.by_key.remove(store_key)?;
        let entry = self.slots[id as usize].take()?;
        for (term, _) in &entry.terms {
            if let Some(p) = self.postings.get_mut(term) {
                p.remove(&id);
                if p.is_empty() {
                    self.postings.remove(term);
                }
            }
        }
        self.total_len -= u64::from(entry.len);
        self.bytes -= entry.bytes;
        self.free.push(id);
        Some(entry)
    }

    /// Adds `vector` to the item under `store_key`, if it is there.
    pub fn set_vector(&mut self, store_key: &str, vector: Vec<f32>) {
        if let Some(&id) = self.by_key.get(store_key)
            && let Some(e) = self.slots[id as usize].as_mut()
        {
            e.vector = Some(vector.into());
        }
    }

    /// The store keys of the live items under `prefix`, best first, with
    /// their scores: by BM25 for `query` (items matching no term left
    /// out), else newest first with score 0. With `semantic` (and a
    /// query), BM25's ranking fused with the items' cosines to the
    /// query's vector ([`super::embed`]: reciprocal rank fusion).
    pub fn ranked(
        &self,
        prefix: &[String],
        query: Option<&str>,
        semantic: Option<Semantic<'_>>,
        now: i64,
    ) -> Vec<(String, f64)> {
        let bm25 = self.ranked_bm25(prefix, query, now);
        let Some(semantic) = semantic.filter(|_| query.is_some()) else {
            return bm25;
        };
        let mut by_vector: Vec<(&str, f32, i64)> = self
            .by_key
            .iter()
            .filter_map(|(k, &id)| {
                let e = self.slots[id as usize].as_ref()?;
                if e.expired(now) || !under(&e.namespace, prefix) {
                    return None;
                }
                let v = e.vector.as_ref()?;
                if v.len() != semantic.vector.len() {
                    return None;
                }
                let cos: f32 = v.iter().zip(semantic.vector).map(|(a, b)| a * b).sum();
                (cos >= semantic.min_similarity).then_some((k.as_str(), cos, e.updated_at))
            })
            .collect();
        by_vector.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.cmp(&a.2))
                .then_with(|| a.0.cmp(b.0))
        });
        let mut fused: HashMap<String, f64> = HashMap::new();
        for (rank, (k, _)) in bm25.into_iter().enumerate() {
            *fused.entry(k).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
        for (rank, (k, _, _)) in by_vector.into_iter().enumerate() {
            *fused.entry(k.to_string()).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
        let mut out: Vec<(String, f64)> = fused.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    fn ranked_bm25(&self, prefix: &[String], query: Option<&str>, now: i64) -> Vec<(String, f64)> {
        let keys: HashMap<u32, &str> = self
            .by_key
            .iter()
            .map(|(k, &id)| (id, k.as_str()))
            .collect();
        let live = |id: u32| {
            self.slots[id as usize]
                .as_ref()
                .filter(|e| !e.expired(now) && under(&e.namespace, prefix))
        };
        let mut out: Vec<(String, f64, i64)> = match query.map(tokens) {
            Some(terms) => {
                let n = self.by_key.len() as f64;
                let avg = (self.total_len as f64 / n.max(1.0)).max(1.0);
                let mut scores: HashMap<u32, f64> = HashMap::new();
                let distinct: BTreeSet<String> = terms.into_iter().collect();
                for term in distinct {
                    let Some(posting) = self.postings.get(&term) else {
                        continue;
                    };
                    let df = posting.len() as f64;
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    for (&id, &tf) in posting {
                        let Some(e) = live(id) else { continue };
                        let tf = f64::from(tf);
                        let norm = K1 * (1.0 - B + B * f64::from(e.len) / avg);
                        *scores.entry(id).or_default() += idf * tf * (K1 + 1.0) / (tf + norm);
                    }
                }
                scores
                    .into_iter()
                    .map(|(id, s)| {
                        (
                            keys[&id].to_string(),
                            s,
                            live(id).map_or(0, |e| e.updated_at),
                        )
                    })
                    .collect()
            }
            None => keys
                .iter()
                .filter_map(|(&id, k)| live(id).map(|e| (k.to_string(), 0.0, e.updated_at)))
                .collect(),
        };
        out.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.cmp(&a.2))
                .then_with(|| a.0.cmp(&b.0))
        });
        out.into_iter().map(|(k, s, _)| (k, s)).collect()
    }

    /// The distinct namespaces of live items under `prefix`, each cut to
    /// `max_depth` segments when given, sorted.
    pub fn namespaces(
        &self,
        prefix: &[String],
        max_depth: Option<usize>,
        now: i64,
    ) -> Vec<Vec<String>> {
        let mut out = BTreeSet::new();
        for e in self.slots.iter().flatten() {
            if e.expired(now) || !under(&e.namespace, prefix) {
                continue;
            }
            let depth = max_depth.unwrap_or(usize::MAX).min(e.namespace.len());
            out.insert(e.namespace[..depth].to_vec());
        }
        out.into_iter().collect()
    }

    /// The store keys of the items expired at `now`.
    pub fn expired(&self, now: i64) -> Vec<String> {
        self.by_key
            .iter()
            .filter(|(_, id)| {
                self.slots[**id as usize]
                    .as_ref()
                    .is_some_and(|e| e.expired(now))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Vec<String> {
        s.split('.').map(str::to_string).collect()
    }

    fn entry(n: &str, key: &str, text: &str) -> Entry {
        Entry::new(ns(n), key.into(), text, text.len() as u64, None, 0)
    }

    #[test]
    fn tokens_are_lowercased_words_without_possessives() {
        assert_eq!(
            tokens("What is the Dog's name? It's Rex, a 3-year-old."),
            [
                "what", "is", "the", "dog", "name", "it", "rex", "year", "old"
            ]
        );
        assert_eq!(tokens("o'sullivan"), ["osullivan"]);
        assert_eq!(
            tokens("Deploys stories class is bus"),
            ["deploy", "story", "class", "is", "bus"]
        );
    }

    #[test]
    fn the_relevant_item_ranks_first_and_removal_forgets_it() {
        let mut idx = TenantIndex::default();
        for i in 0..50 {
            idx.upsert(
                &format!("d{i}"),
                entry(
                    "users.u1",
                    &format!("d{i}"),
                    "the user likes the weather and the news",
                ),
            );
        }
        idx.upsert("dog", entry("users.u1", "dog", "the dog is named Rex"));
        let ranked = idx.ranked(&ns("users"), Some("what is the dog's name"), None, 0);
        assert_eq!(ranked[0].0, "dog");
        assert!(ranked[0].1 > ranked[1].1);
        assert!(idx.ranked(&ns("teams"), Some("dog"), None, 0).is_empty());
        idx.remove("dog");
        assert!(idx.ranked(&[], Some("dog"), None, 0).is_empty());
        assert_eq!(idx.usage().0, 50);
    }

    #[test]
    fn expired_items_are_not_found_nor_listed() {
        let mut idx = TenantIndex::default();
        let mut e = entry("a.b", "k", "hello there");
        e.expires_at = Some(10);
        idx.upsert("k", e);
        assert_eq!(idx.ranked(&[], Some("hello"), None, 5).len(), 1);
        assert!(idx.ranked(&[], Some("hello"), None, 10).is_empty());
        assert!(idx.namespaces(&[], None, 10).is_empty());
        assert_eq!(idx.expired(10), ["k"]);
    }

    #[test]
    fn a_vector_finds_what_no_word_does_and_both_lists_rank_first() {
        let mut idx = TenantIndex::default();
        idx.upsert("rex", entry("u", "rex", "Rex is a loyal canine"));
        idx.upsert("class", entry("u", "class", "puppy classes start in May"));
        idx.upsert("bill", entry("u", "bill", "the invoice is due"));
        idx.set_vector("rex", vec![1.0, 0.0]);
        idx.set_vector("class", vec![0.8, 0.6]);
        idx.set_vector("bill", vec![0.0, 1.0]);
        let keys = |r: Vec<(String, f64)>| r.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(keys(idx.ranked(&[], Some("puppy"), None, 0)), ["class"]);
        let q = Semantic {
            vector: &[1.0, 0.0],
            min_similarity: 0.3,
        };
        // `class` is first of BM25 and second of the vectors; `rex` first
        // of the vectors only; `bill` is under the least similarity.
        assert_eq!(
            keys(idx.ranked(&[], Some("puppy"), Some(q), 0)),
            ["class", "rex"]
        );
        // No query: no semantic ranking (newest first, as ever).
        assert_eq!(idx.ranked(&[], None, Some(q), 0).len(), 3);
    }

    #[test]
    fn namespaces_are_cut_to_max_depth() {
        let mut idx = TenantIndex::default();
        idx.upsert("1", entry("users.u1.prefs", "k", "x"));
        idx.upsert("2", entry("users.u2", "k", "x"));
        idx.upsert("3", entry("teams.t", "k", "x"));
        assert_eq!(
            idx.namespaces(&ns("users"), Some(2), 0),
            [ns("users.u1"), ns("users.u2")]
        );
    }
}
