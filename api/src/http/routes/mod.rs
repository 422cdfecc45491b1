pub mod health;
pub mod jobs;
pub mod projects;
pub mod sessions;
