//! Client surfaces as a user runs them: transcript import (Claude Code, Codex, Aider), the Claude
//! Code hook client and installer, the `zuno mcp` stdio server, and the `learn`/`memory` commands.

mod aider;
mod fixtures;
mod hook;
mod import;
mod install;
mod learn;
mod mcp;
mod parse;
