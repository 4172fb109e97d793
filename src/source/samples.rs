//! The samples of a listing, held compactly.
//!
//! A listing holds every sample of the source at once, tens of millions for the largest trees,
//! so its memory is what a run's memory grows with. One allocation per path plus a struct per
//! sample cost ~100 bytes a sample beside the path; here the paths sit end to end in one
//! buffer, and a sample costs 12 bytes beside its path (where its path ends, its class), 8 more
//! when the source knows sizes (a plan, a packed dataset) and 4 more once shuffled. At
//! 10,000,000 ImageNet-like files (~32-byte paths) that is ~440 MB rather than ~1.3 GB.
//!
//! A shuffle permutes an index into the samples rather than the samples themselves: the same
//! order as shuffling them in place, without a second copy of the paths while it is made.

use super::SourceSample;

/// The samples of a listing, in order: see the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Samples {
    /// Every relative path, one after another.
    paths: Vec<u8>,
    /// Where each sample's path ends in `paths` (it starts where the one before ends).
    ends: Vec<u64>,
    /// Each sample's class index.
    classes: Vec<u32>,
    /// Each sample's size, or empty while every size is unknown (0).
    sizes: Vec<u64>,
    /// After a shuffle: which stored sample is at each position. Empty: the stored order.
    order: Vec<u32>,
    /// The index of the first stored sample in its source (a part of a plan starts past 0).
    first: u64,
}

impl Samples {
    /// No samples, with room for `samples` of them and `path_bytes` of paths in all.
    pub fn with_capacity(samples: usize, path_bytes: usize) -> Samples {
        Samples {
            paths: Vec::with_capacity(path_bytes),
            ends: Vec::with_capacity(samples),
            classes: Vec::with_capacity(samples),
            ..Samples::default()
        }
    }

    /// Appends a sample. Its index in the source is the next one.
    ///
    /// # Panics
    ///
    /// After [`Samples::shuffle`]: the shuffled order covers the samples it was made for.
    pub fn push(&mut self, rel_path: &[u8], class: u32, size: u64) {
        assert!(self.order.is_empty(), "samples are appended before they are shuffled");
        self.paths.extend_from_slice(rel_path);
        self.ends.push(self.paths.len() as u64);
        self.classes.push(class);
        if size != 0 || !self.sizes.is_empty() {
            // The first known size: the samples before it had none.
            self.sizes.resize(self.classes.len() - 1, 0);
            self.sizes.push(size);
        }
    }

    /// Appends every sample of `other`, in its order.
    ///
    /// # Panics
    ///
    /// After [`Samples::shuffle`], as [`Samples::push`].
    pub fn extend(&mut self, other: &Samples) {
        assert!(self.order.is_empty(), "samples are appended before they are shuffled");
        if !other.order.is_empty() {
            other.iter().for_each(|s| self.push(s.rel_path, s.class, s.size));
            return;
        }
        let (before, base) = (self.len(), self.paths.len() as u64);
        self.paths.extend_from_slice(&other.paths);
        self.ends.extend(other.ends.iter().map(|end| end + base));
        self.classes.extend_from_slice(&other.classes);
        if !other.sizes.is_empty() || !self.sizes.is_empty() {
            self.sizes.resize(before, 0);
            match other.sizes.is_empty() {
                true => self.sizes.resize(self.len(), 0),
                false => self.sizes.extend_from_slice(&other.sizes),
            }
        }
    }

    /// Says that the first sample is sample `first` of its source: indices count from there.
    pub fn set_first(&mut self, first: u64) {
        self.first = first;
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The sample at `position`.
    ///
    /// # Panics
    ///
    /// If `position` is out of range, as indexing a slice does.
    pub fn get(&self, position: usize) -> SourceSample<'_> {
        let stored = if self.order.is_empty() { position } else { self.order[position] as usize };
        let start = if stored == 0 { 0 } else { self.ends[stored - 1] as usize };
        SourceSample {
            index: self.first + stored as u64,
            rel_path: &self.paths[start..self.ends[stored] as usize],
            class: self.classes[stored],
            size: self.sizes.get(stored).copied().unwrap_or(0),
        }
    }

    /// The sample at `position`, if there is one.
    pub fn try_get(&self, position: usize) -> Option<SourceSample<'_>> {
        (position < self.len()).then(|| self.get(position))
    }

    /// The samples in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = SourceSample<'_>> + DoubleEndedIterator + Clone + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The samples in order, for rayon.
    pub fn par_iter(&self) -> impl rayon::iter::IndexedParallelIterator<Item = SourceSample<'_>> + '_ {
        use rayon::prelude::*;
        (0..self.len()).into_par_iter().map(|i| self.get(i))
    }

    /// The bytes of all paths together.
    pub fn path_bytes(&self) -> usize {
        self.paths.len()
    }

    /// Every sample's size summed (0 when the source knows none).
    pub fn total_size(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// Puts the samples in the order `crate::shuffle::shuffle` gives them for `seed`.
    ///
    /// # Panics
    ///
    /// With more than `u32::MAX` samples.
    pub fn shuffle(&mut self, seed: u64) {
        let len = u32::try_from(self.len()).expect("at most u32::MAX samples are shuffled");
        let mut order: Vec<u32> =
            if self.order.is_empty() { (0..len).collect() } else { std::mem::take(&mut self.order) };
        crate::shuffle::shuffle(&mut order, seed);
        self.order = order;
    }
}

impl<'a> FromIterator<SourceSample<'a>> for Samples {
    /// Samples in the iterator's order; their `index` fields are not kept (they count from 0).
    fn from_iter<I: IntoIterator<Item = SourceSample<'a>>>(iter: I) -> Samples {
        let mut samples = Samples::default();
        for sample in iter {
            samples.push(sample.rel_path, sample.class, sample.size);
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn sample(rel: &str, class: u32, size: u64) -> SourceSample<'_> {
        SourceSample { index: 0, rel_path: rel.as_bytes(), class, size }
    }

    #[test]
    fn holds_each_sample_as_pushed() {
        let mut samples = Samples::with_capacity(3, 20);
        samples.push(b"a/1.jpg", 0, 0);
        samples.push(b"", 1, 0);
        samples.push(b"b/\xff.png", 1, 9);
        assert_eq!(samples.len(), 3);
        let got: Vec<_> = samples.iter().map(|s| (s.index, s.rel_path.to_vec(), s.class, s.size)).collect();
        assert_eq!(
            got,
            [(0, b"a/1.jpg".to_vec(), 0, 0), (1, Vec::new(), 1, 0), (2, b"b/\xff.png".to_vec(), 1, 9)]
        );
        assert_eq!(samples.total_size(), 9);
        assert_eq!(samples.try_get(3), None);
        samples.set_first(10);
        assert_eq!(samples.get(2).index, 12, "indices count from the first");
    }

    #[test]
    fn shuffles_as_shuffling_the_samples_in_place() {
        let names: Vec<String> = (0..500).map(|i| format!("c/{i}.jpg")).collect();
        let mut samples: Samples = names.iter().map(|n| sample(n, 0, 0)).collect();
        let mut expected: Vec<(u64, &str)> =
            names.iter().enumerate().map(|(i, n)| (i as u64, n.as_str())).collect();
        samples.shuffle(7);
        crate::shuffle::shuffle(&mut expected, 7);
        let got: Vec<(u64, String)> =
            samples.iter().map(|s| (s.index, String::from_utf8(s.rel_path.to_vec()).unwrap())).collect();
        let expected: Vec<(u64, String)> = expected.into_iter().map(|(i, n)| (i, n.to_string())).collect();
        assert_eq!(got, expected, "same order, and each keeps its source index");
        assert_ne!(got[0].0, 0, "seed 7 moves the first sample");
    }

    #[test]
    fn extending_keeps_the_order_and_the_sizes() {
        let mut a: Samples = [sample("a/1", 0, 0)].into_iter().collect();
        let b: Samples = [sample("b/1", 1, 5), sample("b/2", 1, 0)].into_iter().collect();
        a.extend(&b);
        let got: Vec<_> = a.iter().map(|s| (s.rel_path.to_vec(), s.size)).collect();
        assert_eq!(got, [(b"a/1".to_vec(), 0), (b"b/1".to_vec(), 5), (b"b/2".to_vec(), 0)]);
        assert_eq!(a.par_iter().map(|s| s.class).collect::<Vec<_>>(), [0, 1, 1]);
    }
}
