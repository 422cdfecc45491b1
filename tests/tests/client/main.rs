//! Client surfaces as a user runs them: transcript import (Claude Code, Codex, Aider), the Claude
//! Code and Codex hook clients and installers, the Claude Code memory import, the `zuno mcp`
//! stdio server, the `learn`/`memory` commands, and the model the installers propose.

mod aider;
mod claude_memory;
mod codex;
mod fixtures;
mod hook;
mod import;
mod install;
mod learn;
mod mcp;
mod model_setup;
mod parse;
mod schema;
