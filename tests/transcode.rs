//! --mode reencode and --mode decode through the real binary: sizes, formats, fields,
//! decompression bombs, corrupt images, determinism.

use std::fs;
use std::path::Path;

use crate::util::*;

/// Source dimensions from the image header, independently of the code under test.
fn dims(path: &Path) -> (u32, u32) {
    image::ImageReader::open(path).unwrap().with_guessed_format().unwrap().into_dimensions().unwrap()
}

/// `.npy` shape (h, w, c) parsed by hand.
fn npy_shape(bytes: &[u8]) -> (u32, u32, u32) {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    assert!(header.contains("'descr': '|u1'") && header.contains("'fortran_order': False"), "{header}");
    let shape = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let d: Vec<u32> = shape.split(',').map(|x| x.trim().parse().unwrap()).collect();
    assert_eq!(bytes.len(), 10 + len + (d[0] * d[1] * d[2]) as usize);
    (d[0], d[1], d[2])
}

#[test]
fn reencode_resizes_the_shorter_side_and_stores_jpeg() {
    let fx = Fixture::new();
    let out = fx.out("r.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"])
        .args(["--mode", "reencode", "--resize-shorter", "100", "--quality", "85"])
        .assert()
        .code(0);
    let s = summary(&assert.get_output().stdout);
    let expected = expected_samples(&fx.tree(), &ALL_EXTS);
    assert_eq!(s["packed"], expected.len());
    let ds = imgpack_reader::open(&out).unwrap();
    assert_eq!(ds.meta().fields, ["cls", "jpg", "json"]);
    assert_eq!(ds.meta().options["mode"], "reencode");
    assert_eq!(ds.meta().options["quality"], 85);
    assert_eq!(ds.meta().options["resize_shorter"], 100);
    for (i, (rel, _)) in expected.iter().enumerate() {
        let sample = ds.get(i as u64).unwrap();
        let jpeg = sample.field("jpg").unwrap_or_else(|| panic!("{rel} stored as jpg"));
        let header = turbojpeg::read_header(jpeg).unwrap();
        let (w, h) = dims(&fx.tree().join(rel));
        let (short, long) = (w.min(h), w.max(h));
        let want = if short <= 100 {
            (w, h)
        } else if w <= h {
            (100, 100 * long / short)
        } else {
            (100 * long / short, 100)
        };
        assert_eq!((header.width as u32, header.height as u32), want, "{rel} from {w}x{h}");
    }
}

#[test]
fn keep_if_fits_stores_fitting_jpegs_unchanged() {
    let fx = Fixture::new();
    let out = fx.out("k.lmdb");
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json"])
        .args(["--mode", "reencode", "--max-side", "100000", "--keep-if-fits"])
        .assert()
        .code(0);
    let s = summary(&assert.get_output().stdout);
    let expected = expected_samples(&fx.tree(), &ALL_EXTS);
    let ds = imgpack_reader::open(&out).unwrap();
    let mut kept = 0;
    for (i, (rel, _)) in expected.iter().enumerate() {
        let source = fs::read(fx.tree().join(rel)).unwrap();
        let stored = ds.get(i as u64).unwrap().field("jpg").unwrap().to_vec();
        let is_plain_jpeg = imgpack_reader::ImageFormat::sniff(&source)
            == Some(imgpack_reader::ImageFormat::Jpeg)
            && !rel.ends_with("cmyk.jpg");
        assert_eq!(stored == source, is_plain_jpeg, "{rel}: kept unchanged iff it is an RGB/grey JPEG");
        kept += u64::from(is_plain_jpeg);
    }
    assert_eq!(s["kept_unchanged"], kept);
    assert!(kept >= 15);
}

#[test]
fn decode_stores_npy_with_crop_and_compression() {
    let fx = Fixture::new();
    let plain = fx.out("d.wds");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &plain, &"-q"])
        .args(["--mode", "decode", "--resize-shorter", "40", "--center-crop", "32"])
        .assert()
        .code(0);
    let zst = fx.out("z.wds");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"webdataset", &"-o", &zst, &"-q"])
        .args(["--mode", "decode", "--resize-shorter", "40", "--center-crop", "32", "--compress", "zstd:5"])
        .assert()
        .code(0);
    let a = imgpack_reader::open(&plain).unwrap();
    let b = imgpack_reader::open(&zst).unwrap();
    assert_eq!(a.meta().fields, ["cls", "json", "npy"]);
    assert_eq!(b.meta().fields, ["cls", "json", "npy.zst"]);
    assert_eq!(b.meta().options["compress"], "zstd:5");
    for i in 0..a.len() {
        let npy = a.get(i).unwrap().field("npy").unwrap().to_vec();
        assert_eq!(npy_shape(&npy), (32, 32, 3), "fixed-size records");
        let compressed = b.get(i).unwrap().field("npy.zst").unwrap().to_vec();
        assert_eq!(zstd::decode_all(&compressed[..]).unwrap(), npy, "npy.zst holds the same pixels");
    }
}

#[test]
fn decode_without_resize_keeps_sizes_and_color_keep_keeps_grey() {
    let fx = Fixture::new();
    let out = fx.out("g.lmdb");
    pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q"])
        .args(["--mode", "decode", "--color", "keep"])
        .assert()
        .code(0);
    let ds = imgpack_reader::open(&out).unwrap();
    for (i, (rel, _)) in expected_samples(&fx.tree(), &ALL_EXTS).iter().enumerate() {
        let (h, w, c) = npy_shape(ds.get(i as u64).unwrap().field("npy").unwrap());
        assert_eq!((w, h), dims(&fx.tree().join(rel)), "{rel}");
        let grey = rel.ends_with("gray.jpg") || rel.ends_with(".pgm");
        assert_eq!(c, if grey { 1 } else { 3 }, "{rel}");
    }
}

#[test]
fn bombs_and_corrupt_images_are_skipped_with_reasons() {
    let fx = Fixture::new();
    // A PNG whose header claims 20000 x 20000: refused from the header, before any decoding.
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&20000u32.to_be_bytes());
    ihdr.extend_from_slice(&20000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
    png.extend_from_slice(&13u32.to_be_bytes());
    png.extend_from_slice(&ihdr);
    png.extend_from_slice(&crc32(&ihdr).to_be_bytes());
    // The start of an IDAT chunk: decoders read the header up to here. No pixel data follows.
    png.extend_from_slice(&2u32.to_be_bytes());
    png.extend_from_slice(b"IDATx\x9c");
    png.extend_from_slice(&crc32(b"IDATx\x9c").to_be_bytes());
    // And an end chunk, so the file is whole as a container: the pixel limit is what refuses it.
    png.extend_from_slice(&0u32.to_be_bytes());
    png.extend_from_slice(b"IEND");
    png.extend_from_slice(&crc32(b"IEND").to_be_bytes());
    fs::write(fx.tree().join("space/bomb.png"), &png).unwrap();
    fx.add_bad("cat", "truncated.jpg");
    let out = fx.out("b.lmdb");
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"--json", &"--mode", &"decode"])
            .assert()
            .code(3);
    let s = summary(&assert.get_output().stdout);
    let skipped = s["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    let reason = |name: &str| {
        skipped.iter().find(|e| e["path"].as_str().unwrap().ends_with(name)).unwrap()["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        reason("bomb.png").contains("20000x20000 = 400000000 pixels is more than --max-pixels 178956970"),
        "{}",
        reason("bomb.png")
    );
    assert!(reason("truncated.jpg").contains("jpg"), "{}", reason("truncated.jpg"));
    assert_eq!(s["packed"].as_u64().unwrap() + 2, s["found"].as_u64().unwrap());
    // In passthrough the bomb is refused too (Pillow would refuse to open it), and so is the
    // truncated JPEG, whose header is intact: its markers end before the end-of-image marker.
    let assert = pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &fx.out("p.lmdb"), &"--json"])
        .assert()
        .code(3);
    let s = summary(&assert.get_output().stdout);
    let skipped = s["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    let truncated = skipped.iter().find(|e| e["path"].as_str().unwrap().ends_with("truncated.jpg")).unwrap();
    assert!(truncated["reason"].as_str().unwrap().starts_with("truncated jpg"), "{truncated}");
}

#[test]
fn reencoded_output_is_identical_whatever_the_thread_count() {
    let fx = Fixture::new();
    let dumps: Vec<_> = ["1", "2", "8"]
        .iter()
        .map(|t| {
            let out = fx.out(&format!("t{t}.lmdb"));
            pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &out, &"-q", &"--threads", t])
                .args(["--mode", "reencode", "--resize-shorter", "64"])
                .assert()
                .code(0);
            dump(&out)
        })
        .collect();
    assert_eq!(dumps[0], dumps[1]);
    assert_eq!(dumps[0], dumps[2]);
}

#[test]
fn mode_flags_that_do_not_apply_are_refused() {
    let fx = Fixture::new();
    let assert =
        pack(&[&"imagefolder", &fx.tree(), &"--to", &"lmdb", &"-o", &fx.out("x"), &"--quality", &"80"])
            .assert()
            .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
    assert!(stderr.contains("--quality does not apply to --mode passthrough"), "{stderr}");
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
