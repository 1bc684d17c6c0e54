//! Bad inputs: failing DataLoader samples.

use super::support::*;
use super::{Case, Class};
use kiln::data::DataLoader;
use kiln::Error;

pub fn cases() -> Vec<Case> {
    vec![
        // ---- DataLoader: which sample, which batch, which worker
        case!(
            Data,
            "DataLoader",
            ["dataset index 4", "batch 1", "main thread", "sample is bad"],
            failing_loader(0)
        ),
        case!(
            Data,
            "DataLoader",
            [
                "dataset index 4",
                "batch 1",
                "worker 1 of 2",
                "sample is bad"
            ],
            failing_loader(2)
        ),
        case!(
            Data,
            "DataLoader",
            ["collating batch 0", "dataset indices [0, 1, 2]"],
            {
                let mut l = DataLoader::new(ds(6), 3)
                    .collate(|_| Err(Error::op("collate", "shapes differ")));
                l.iter().try_for_each(|b| b.map(|_| ()))
            }
        ),
        case!(
            Data,
            "DataLoader",
            [
                "loading dataset index 7",
                "batch 3",
                "main thread",
                "disk gone"
            ],
            {
                let mut l = DataLoader::new(Failing, 2);
                l.iter().try_for_each(|b| b.map(|_| ()))
            }
        ),
    ]
}
