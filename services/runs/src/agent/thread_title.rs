//! Setting the thread's title from inside a run (the Title middleware). Like every agent write it is
//! refused once this worker no longer owns the run.

use super::AgentContext;

impl AgentContext {
    /// Sets the title of the run's thread (at most 256 characters are kept, the API's limit). It is
    /// written with the next checkpoint — in the statement that moves the thread's head — or by the
    /// next flush.
    pub fn stage_thread_title(&self, title: &str) {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).title = Some(title.chars().take(256).collect());
    }
}
