//! The `kine-rs inspect` subcommand's arguments (what it does: `crate::inspect`).

use kine_core::Revision;

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What to read.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum InspectCommand {
    /// The current and compact revisions, the number of keys and leases, the size
    Status,
    /// The keys under PREFIX (every key without one) at a revision
    List {
        /// Only keys that start with this
        prefix: Option<String>,
        /// Read at this revision (0: the current one)
        #[arg(long, default_value_t = 0)]
        revision: Revision,
        /// Print values too
        #[arg(long)]
        values: bool,
    },
    /// One key and its value at a revision
    Get {
        key: String,
        /// Read at this revision (0: the current one)
        #[arg(long, default_value_t = 0)]
        revision: Revision,
    },
    /// Every version of KEY the datastore still holds (its version at the compact revision,
    /// then every put and delete since), oldest first
    History {
        key: String,
        /// Every key that starts with KEY, in revision order
        #[arg(long)]
        prefix: bool,
        /// Print values too
        #[arg(long)]
        values: bool,
    },
    /// The keys created, deleted and changed between two revisions
    Diff {
        from: Revision,
        to: Revision,
        /// Only keys that start with this
        prefix: Option<String>,
    },
}
