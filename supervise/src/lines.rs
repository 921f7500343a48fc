//! Lines read from a less-privileged process with a bound on each: PID 1
//! reads the drain helper's reports and a hook's output line by line, and
//! one endless line must not grow its memory (R-SEC-5). A longer line is
//! cut at the bound; the rest of it is read and dropped.

use std::io::{BufRead, BufReader, Read};

/// The bound on one line of a child's output that PID 1 keeps.
pub const LINE_MAX: usize = 64 * 1024;

/// Lines of a reader (without their `\n`), each at most `max` bytes.
pub struct BoundedLines<R> {
    reader: BufReader<R>,
    max: usize,
}

/// Returns the lines of `r`, each cut at `max` bytes.
pub fn bounded_lines<R: Read>(r: R, max: usize) -> BoundedLines<R> {
    BoundedLines {
        reader: BufReader::new(r),
        max,
    }
}

impl<R: Read> Iterator for BoundedLines<R> {
    /// A line, and whether it was cut.
    type Item = std::io::Result<(Vec<u8>, bool)>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut line = Vec::new();
        let mut cut = false;
        loop {
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Some(Err(e)),
            };
            if buf.is_empty() {
                return (!line.is_empty() || cut).then_some(Ok((line, cut)));
            }
            let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            let room = self.max - line.len();
            cut |= chunk.len() > room;
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let used = end.unwrap_or(buf.len());
            self.reader.consume(used);
            if end.is_some() {
                return Some(Ok((line, cut)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of `n` bytes of `x`, then `tail`, without holding them.
    struct Endless {
        left: usize,
        tail: &'static [u8],
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.left > 0 {
                let n = buf.len().min(self.left);
                buf[..n].fill(b'x');
                self.left -= n;
                return Ok(n);
            }
            let n = buf.len().min(self.tail.len());
            buf[..n].copy_from_slice(&self.tail[..n]);
            self.tail = &self.tail[n..];
            Ok(n)
        }
    }

    #[test]
    fn lines_are_cut_at_the_bound_and_the_rest_of_a_long_one_dropped() {
        let got: Vec<_> = bounded_lines(&b"a\nbcdef\n\ngh"[..], 3)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), false),
                (b"bcd".to_vec(), true),
                (Vec::new(), false),
                (b"gh".to_vec(), false),
            ]
        );
    }

    #[test]
    fn a_line_of_a_gigabyte_costs_one_bound() {
        let r = Endless {
            left: 1 << 30,
            tail: b"\n{\"event\":\"drain\"}\n",
        };
        let got: Vec<_> = bounded_lines(r, LINE_MAX).map(Result::unwrap).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.len(), LINE_MAX);
        assert!(got[0].1);
        assert_eq!(got[1], (b"{\"event\":\"drain\"}".to_vec(), false));
    }
}
