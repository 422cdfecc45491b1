//! Reciprocal rank fusion of the lexical and the vector ranking (Cormack et al., 2009): an
//! experience scores `Σ 1 / (k + rank)` over the rankings it appears in (ranks from 1,
//! `k` = [`RRF_K`]), so agreement between the two lifts an item and neither ranking's raw scores
//! need to be comparable.
//!
//! The relevance floor holds per source: every lexical hit already passed the lexical floor;
//! an experience found only by its vector joins when its cosine similarity reaches
//! `embeddings.min_similarity`, and is dropped otherwise (it still lifts nothing). The fused
//! list then goes through the same token budget and item limit as lexical recall.

use std::collections::HashMap;

use serde_json::json;

use crate::learning::retrieval::SearchHit;

/// The rank constant of reciprocal rank fusion (the value of the original paper).
pub const RRF_K: f64 = 60.0;

/// How one fused experience was found, for the receipt's retrieval record.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedEntry {
    pub id: String,
    /// 1-based rank in the lexical ranking.
    pub lexical_rank: Option<usize>,
    /// 1-based rank in the vector ranking.
    pub vector_rank: Option<usize>,
    pub similarity: Option<f64>,
    pub score: f64,
}

impl FusedEntry {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "id": self.id,
            "lexicalRank": self.lexical_rank,
            "vectorRank": self.vector_rank,
            "similarity": self.similarity,
            "score": self.score,
        })
    }
}

/// Fuses `lexical` (best first, floor applied) with `vector` (best first, with similarities).
/// Returns the fused hits best first (their `score` is the fusion score, `relevance` the lexical
/// relevance, or the similarity for a vector-only hit) and how each was found. Ties keep the
/// lexical order, then the id.
pub fn reciprocal_rank_fusion(
    lexical: Vec<SearchHit>,
    vector: Vec<(SearchHit, f64)>,
    min_similarity: f64,
) -> (Vec<SearchHit>, Vec<FusedEntry>) {
    let mut entries: Vec<(SearchHit, FusedEntry)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    for (index, hit) in lexical.into_iter().enumerate() {
        let rank = index + 1;
        let entry = FusedEntry {
            id: hit.experience.id.clone(),
            lexical_rank: Some(rank),
            vector_rank: None,
            similarity: None,
            score: 1.0 / (RRF_K + rank as f64),
        };
        position.insert(entry.id.clone(), entries.len());
        entries.push((hit, entry));
    }
    for (index, (hit, similarity)) in vector.into_iter().enumerate() {
        let rank = index + 1;
        let share = 1.0 / (RRF_K + rank as f64);
        match position.get(&hit.experience.id) {
            Some(&at) => {
                let entry = &mut entries[at].1;
                entry.vector_rank = Some(rank);
                entry.similarity = Some(similarity);
                entry.score += share;
            }
            None if similarity >= min_similarity => {
                let entry = FusedEntry {
                    id: hit.experience.id.clone(),
                    lexical_rank: None,
                    vector_rank: Some(rank),
                    similarity: Some(similarity),
                    score: share,
                };
                position.insert(entry.id.clone(), entries.len());
                entries.push((hit, entry));
            }
            None => {}
        }
    }
    entries.sort_by(|(_, a), (_, b)| {
        b.score
            .total_cmp(&a.score)
            .then(
                a.lexical_rank
                    .unwrap_or(usize::MAX)
                    .cmp(&b.lexical_rank.unwrap_or(usize::MAX)),
            )
            .then(a.id.cmp(&b.id))
    });
    entries
        .into_iter()
        .map(|(mut hit, entry)| {
            hit.score = entry.score;
            (hit, entry)
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learning::experience::{
        Experience, ExperienceOrigin, ExperienceStatus, Verification,
    };
    use crate::learning::extraction::ExperienceKind;

    fn hit(id: &str) -> SearchHit {
        SearchHit {
            source: format!("project p · {id}"),
            experience: Experience {
                id: id.to_owned(),
                project_id: "p".into(),
                session_id: None,
                job_id: None,
                ordinal: None,
                origin: ExperienceOrigin::Remember,
                extractor_version: None,
                kind: ExperienceKind::Feedback,
                title: id.to_owned(),
                summary: id.to_owned(),
                resolution: None,
                confidence: 1.0,
                verification: Verification::Verified,
                status: ExperienceStatus::Active,
                content_digest: String::new(),
                use_count: 0,
                last_used_at: None,
                created_at: 0,
                updated_at: 0,
                forgotten_at: None,
                keywords: Vec::new(),
                evidence: Vec::new(),
            },
            relevance: 1.0,
            score: 1.0,
        }
    }

    fn ids(hits: &[SearchHit]) -> Vec<&str> {
        hits.iter().map(|h| h.experience.id.as_str()).collect()
    }

    #[test]
    fn agreement_outranks_either_list_alone() {
        let lexical = vec![hit("a"), hit("b"), hit("c")];
        let vector = vec![(hit("c"), 0.9), (hit("d"), 0.95)];
        let (fused, entries) = reciprocal_rank_fusion(lexical, vector, 0.8);
        // c: 1/63 + 1/61 beats a: 1/61; d (vector-only, 0.95 ≥ 0.8) ranks with b by 1/62.
        assert_eq!(ids(&fused), ["c", "a", "b", "d"]);
        let c = &entries[0];
        assert_eq!((c.lexical_rank, c.vector_rank), (Some(3), Some(1)));
        assert!((c.score - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert!((fused[0].score - c.score).abs() < 1e-12);
    }

    #[test]
    fn vector_only_candidates_need_the_similarity_threshold() {
        let lexical = vec![hit("a")];
        let vector = vec![(hit("x"), 0.74), (hit("a"), 0.2), (hit("y"), 0.81)];
        let (fused, entries) = reciprocal_rank_fusion(lexical, vector, 0.75);
        assert_eq!(ids(&fused), ["a", "y"]);
        // A lexical hit keeps its place whatever its similarity; it gains the vector share.
        assert_eq!(entries[0].vector_rank, Some(2));
        assert_eq!(entries[1].similarity, Some(0.81));
    }

    #[test]
    fn without_vectors_the_lexical_order_stands() {
        let lexical = vec![hit("b"), hit("a"), hit("c")];
        let (fused, _) = reciprocal_rank_fusion(lexical, Vec::new(), 0.75);
        assert_eq!(ids(&fused), ["b", "a", "c"]);
    }
}
