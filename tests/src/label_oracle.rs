//! A model that answers like a careful one, from the dev set's labels: an OpenAI-compatible Chat
//! Completions endpoint that, for each extraction request, finds the labelled human prompts (and
//! thumbs-down notes) among the request's sources and answers with the lesson a careful reader
//! wrote for them — the lesson in the user's language, an exact excerpt as the citation,
//! retrieval keywords from the lesson and its situation (never from the follow-up prompts), and a
//! memory hint for user-wide and strongly stated rules. Maintenance, mining and evaluation
//! requests get empty answers (no plan), so the pipeline's own rules must carry the hints.
//!
//! It stands in for a real provider when the model path's answers are recorded as cassettes
//! (`zuno learn eval --record-cassettes`), which the regression test then replays.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

/// The parts of a label the oracle answers from.
#[derive(Debug, Clone)]
struct Lesson {
    excerpt: String,
    lesson: String,
    signal: String,
    strength: String,
    user_wide: bool,
    feedback: bool,
}

pub struct LabelOracle {
    pub address: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for LabelOracle {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl LabelOracle {
    /// Serves on a free loopback port, answering from every labels file in `labels`.
    pub async fn start(labels: &[std::path::PathBuf]) -> anyhow::Result<LabelOracle> {
        let mut lessons = Vec::new();
        for path in labels {
            lessons.extend(read(path)?);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let router = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(complete))
            .with_state(Arc::new(lessons));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(LabelOracle { address, server })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }
}

/// The dev set's labels files (`tests/learning-eval/dev/*.labels.json`), sorted.
pub fn dev_labels(repository: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut labels: Vec<std::path::PathBuf> =
        std::fs::read_dir(repository.join("tests/learning-eval/dev"))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
    labels.sort();
    Ok(labels)
}

fn read(path: &Path) -> anyhow::Result<Vec<Lesson>> {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut lessons = Vec::new();
    for label in file["prompts"].as_array().into_iter().flatten() {
        let text = |key: &str| label[key].as_str().unwrap_or_default().to_owned();
        let strength = text("strength");
        let lesson = text("lesson");
        if lesson.trim().is_empty() || !matches!(strength.as_str(), "strong" | "medium") {
            continue;
        }
        let source = label["source"].as_str().unwrap_or("prompt");
        if source == "tool" {
            continue;
        }
        lessons.push(Lesson {
            excerpt: text("excerpt").trim().to_owned(),
            lesson,
            signal: text("signal"),
            strength,
            user_wide: label["scope"].as_str() == Some("user"),
            feedback: source == "feedback",
        });
    }
    Ok(lessons)
}

async fn complete(
    State(lessons): State<Arc<Vec<Lesson>>>,
    Json(request): Json<Value>,
) -> Json<Value> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let user = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let answer = if system.starts_with("You extract") {
        extraction(&lessons, user)
    } else if system.contains("\"changes\"") {
        json!({ "changes": [] })
    } else if system.contains("\"groups\"") {
        json!({ "groups": [] })
    } else {
        json!({})
    };
    Json(json!({
        "id": "chatcmpl-oracle",
        "object": "chat.completion",
        "model": request["model"],
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": answer.to_string() }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": user.len() / 4, "completion_tokens": 64, "total_tokens": user.len() / 4 + 64 },
    }))
}

/// The careful answer to one extraction request.
fn extraction(lessons: &[Lesson], user: &str) -> Value {
    let sources = user
        .strip_prefix("<sources>\n")
        .and_then(|rest| rest.strip_suffix("\n</sources>"))
        .and_then(|json| serde_json::from_str::<Value>(json).ok())
        .and_then(|value| value["sources"].as_array().cloned())
        .unwrap_or_default();
    let situation = situation(&sources);
    let mut experiences = Vec::new();
    let mut memories = Vec::new();
    let mut seen: HashMap<String, ()> = HashMap::new();
    for source in &sources {
        if source["context"].as_bool() == Some(true) {
            continue;
        }
        let verification = source["verification"].as_str().unwrap_or_default();
        let text = source["text"].as_str().unwrap_or_default();
        let (feedback, own) = match verification {
            "user_statement" => (false, text.trim_start()),
            "user_feedback" => (
                true,
                text.split_once(": ")
                    .map_or("", |(_, note)| note)
                    .trim_start(),
            ),
            _ => continue,
        };
        let Some(lesson) = lessons.iter().find(|l| {
            l.feedback == feedback && l.excerpt.chars().count() >= 4 && own.starts_with(&l.excerpt)
        }) else {
            continue;
        };
        if seen.insert(lesson.lesson.clone(), ()).is_some() {
            continue;
        }
        let kind = match (lesson.signal.as_str(), feedback) {
            (_, true) => "feedback",
            ("preference", _) => "feedback",
            _ => "correction",
        };
        let mut keywords = content_words(&lesson.lesson);
        keywords.extend(situation.iter().cloned());
        keywords.dedup();
        keywords.truncate(12);
        let ordinal = experiences.len();
        experiences.push(json!({
            "kind": kind,
            "title": lesson.lesson.chars().take(80).collect::<String>(),
            "summary": lesson.lesson,
            "resolution": null,
            "citations": [{ "source_id": source["source_id"], "excerpt": lesson.excerpt }],
            "confidence": if lesson.strength == "strong" { 0.9 } else { 0.75 },
            "keywords": keywords,
        }));
        if lesson.user_wide || lesson.strength == "strong" {
            memories.push(json!({
                "experience_ordinal": ordinal,
                "target": if lesson.user_wide { "global" } else { "project" },
                "action": "add",
                "content": lesson.lesson,
                "old_text": null,
                "reason": if lesson.user_wide { "explicit user preference for all work" } else { "explicit user rule" },
                "confidence": 0.9,
            }));
        }
    }
    json!({ "experiences": experiences, "memories": memories })
}

/// Words of a lesson that name things (no stop words, no punctuation), and CJK runs.
fn content_words(text: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "the", "a", "an", "and", "or", "not", "for", "with", "from", "into", "use", "don't", "do",
        "never", "always", "only", "when", "then", "than", "that", "this", "these", "those", "it",
        "its", "is", "are", "be", "of", "in", "on", "to", "as", "at", "by", "so", "if", "your",
        "you", "user", "instead", "before", "after",
    ];
    let mut words: Vec<String> = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || ",;:()\"'`.!?，。；：（）".contains(c))
    {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric() && !"-_/@".contains(c));
        let lower = word.to_lowercase();
        if lower.chars().count() >= 2 && !STOP.contains(&lower.as_str()) && !words.contains(&lower)
        {
            words.push(lower);
        }
    }
    words
}

/// Commands and files of the turn's tool calls, and the words of the request before it.
fn situation(sources: &[Value]) -> Vec<String> {
    let mut words = Vec::new();
    for source in sources {
        let text = source["text"].as_str().unwrap_or_default();
        match source["kind"].as_str() {
            Some("tool_call") => {
                if let Some((_, json)) = text.split_once(' ')
                    && let Ok(arguments) = serde_json::from_str::<Value>(json)
                {
                    for key in ["command", "cmd", "file_path", "path"] {
                        if let Some(value) = arguments[key].as_str() {
                            words.extend(value.split_whitespace().take(2).map(str::to_lowercase));
                        }
                    }
                }
            }
            Some("user_text") if source["context"].as_bool() == Some(true) => {
                words.extend(content_words(text).into_iter().take(6));
            }
            _ => {}
        }
    }
    words
}
