pub mod health;
pub mod jobs;
pub mod learning;
pub mod memory;
pub mod projects;
pub mod sessions;
pub mod skills;
