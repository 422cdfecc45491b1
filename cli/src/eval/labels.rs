//! The label format of the learning-quality harness (documented in `docs/learning-eval.md`):
//! one JSON file per transcript, one label per human prompt (or tool output, or feedback).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::EvalError;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelFile {
    /// Relative to the corpus root, or `project:<path>` relative to the repository.
    pub transcript: String,
    pub format: Format,
    pub project: String,
    pub prompts: Vec<Label>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Aider,
    ClaudeCode,
    Codex,
    /// The synthetic JSONL format of `docs/learning-eval.md`.
    Zuno,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    #[default]
    Prompt,
    Tool,
    Feedback,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    Correction,
    Rejection,
    Preference,
    Confusion,
    Praise,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strength {
    None,
    Weak,
    Medium,
    Strong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    User,
    Project,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Label {
    #[serde(default)]
    pub source: Source,
    pub line: u64,
    pub excerpt: String,
    pub signal: Signal,
    pub strength: Strength,
    pub lesson: Option<String>,
    pub scope: Option<Scope>,
    pub lesson_group: Option<String>,
    #[serde(default)]
    pub follow_up_prompts: Vec<String>,
    #[serde(default)]
    pub negative_prompts: Vec<String>,
    #[serde(default)]
    pub note: Option<String>,
}

impl Label {
    /// A lesson a careful reader keeps: a strong or medium signal with a lesson.
    pub fn is_lesson(&self) -> bool {
        self.strength >= Strength::Medium
            && self.lesson.as_deref().is_some_and(|l| !l.trim().is_empty())
    }

    /// The group the lesson counts in (its own line when the labeller gave none).
    pub fn group(&self) -> String {
        self.lesson_group
            .clone()
            .unwrap_or_else(|| format!("line-{}", self.line))
    }
}

impl LabelFile {
    pub fn read(path: &Path) -> Result<LabelFile, EvalError> {
        let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut deserializer = serde_json::Deserializer::from_str(&text);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| EvalError::Labels {
            path: path.to_path_buf(),
            detail: error.to_string(),
        })
    }

    /// Where the transcript is: `project:` paths below `repository`, others below `corpus`.
    /// Paths may not climb out of their root.
    pub fn transcript_path(&self, corpus: &Path, repository: &Path) -> Result<PathBuf, EvalError> {
        let (root, relative) = match self.transcript.strip_prefix("project:") {
            Some(relative) => (repository, relative),
            None => (corpus, self.transcript.as_str()),
        };
        let relative = Path::new(relative);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(EvalError::Labels {
                path: PathBuf::from(&self.transcript),
                detail: String::from("a transcript path must be relative and stay below its root"),
            });
        }
        Ok(root.join(relative))
    }
}
