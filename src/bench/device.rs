//! What storage is under a path, so a benchmark result can say what it was measured on.
//!
//! A read-latency or throughput figure means nothing on its own: 40 µs per sample is excellent
//! for a network file system, ordinary for a SATA SSD and poor for a warm page cache on NVMe.
//! `pack bench-read` therefore labels every result with the device, transport, rotational flag
//! and file system under the benchmarked path, so that numbers from different machines (or
//! from the same machine on different disks) are never compared blindly.
//!
//! Everything is read from `/proc/self/mountinfo` and sysfs (`/sys/dev/block`, `/sys/class/block`)
//! because both are world-readable: labelling a benchmark must not need root, `udev`, `lsblk` or
//! any other tool. Nothing here fails: whatever cannot be found is reported as `None`,
//! `"unknown"` or an empty name, because a partially labelled result is still better than none.
//!
//! Resolution, in order:
//! 1. the path's `st_dev` (major, minor) and the mountinfo line with the same device whose mount
//!    point is the longest prefix of the canonical path (file system type, mount point, source);
//! 2. `sys/dev/block/MAJ:MIN`, a symlink into `sys/devices/...`; a directory with a `partition`
//!    file is a partition whose parent is the whole disk, where `queue/rotational` and
//!    `device/model` live; the disk's name and sysfs path give the transport;
//! 3. stacked devices (device-mapper, md RAID) are followed through `slaves/` to the disks that
//!    actually hold the data;
//! 4. anonymous devices (major 0: overlay, network and memory file systems, btrfs subvolumes) are
//!    labelled from their file system type, the mount source (`/dev/...`) or, for overlay, the
//!    mount that holds its `upperdir`.

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// What a benchmark result says about the storage under a path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Device {
    /// Block device name, e.g. "nvme0n1", "sda", "vda"; for a partition, the whole disk's name
    /// (partition kept in `partition`). Empty if there is no block device (tmpfs, NFS, overlay
    /// without one...). For an overlay, the device holding its upper dir, when that is visible.
    pub name: String,
    /// The partition the file system is on, e.g. "nvme0n1p2", "sda1"; `None` for a whole disk.
    pub partition: Option<String>,
    /// The disk's model from sysfs (`device/model`, prefixed with `device/vendor` when that adds
    /// information), trimmed; `None` if sysfs has none (virtio disks, RAM disks...).
    pub model: Option<String>,
    /// `queue/rotational` of the whole disk (of the underlying disks for device-mapper and md,
    /// when they agree); `None` if unknown.
    pub rotational: Option<bool>,
    /// How the data is reached: "NVMe", "SATA", "SATA/SCSI", "USB", "virtio", "Xen virtual",
    /// "MMC", "loop", "device-mapper (on sda)", "software RAID (md on sda, sdb)", "RAM disk",
    /// "network (nfs4)", "host share (virtiofs)", "overlay file system (upper dir on vda,
    /// virtio)", "tmpfs (memory)", "FUSE (name)" or "unknown".
    pub transport: String,
    /// File system type from mountinfo, e.g. "ext4", "overlay", "nfs4", "tmpfs"; "unknown" if
    /// no mount was found.
    pub filesystem: String,
    /// Mount point from mountinfo (unescaped); empty if no mount was found.
    pub mount_point: String,
}

const OVERLAY: &str = "overlay file system";
const MEMORY: &str = "tmpfs (memory)";
const OBJECT_STORE: &str = "object store";
const UNKNOWN: &str = "unknown";

impl Device {
    /// The label of an object store reached at `endpoint` (as messages name it): there is no
    /// block device to look up, the endpoint is what a comparison needs.
    pub fn object_store(endpoint: &str) -> Device {
        Device {
            name: String::new(),
            partition: None,
            model: None,
            rotational: None,
            transport: OBJECT_STORE.into(),
            filesystem: "s3".into(),
            mount_point: endpoint.into(),
        }
    }

    /// One short human line for tables, e.g.
    /// "nvme0n1 (Samsung SSD 980 PRO 1TB, NVMe, non-rotational) ext4 on /data",
    /// "vda (virtio, rotational) ext4 on /",
    /// "overlay file system on / (upper dir on vda, virtio, rotational)",
    /// "network file system (nfs4) on /mnt/datasets", "tmpfs in memory on /dev/shm",
    /// "object store (S3 API) at http://127.0.0.1:8333".
    pub fn describe(&self) -> String {
        let on =
            if self.mount_point.is_empty() { String::new() } else { format!(" on {}", self.mount_point) };
        let rotational = self.rotational.map(|r| if r { "rotational" } else { "non-rotational" });

        if let Some(detail) = self.transport.strip_prefix(OVERLAY) {
            // "overlay file system (upper dir on vda, virtio)" -> the part in parentheses.
            let detail = detail.trim().trim_start_matches('(').trim_end_matches(')');
            let parts: Vec<&str> = [Some(detail), self.model.as_deref(), rotational]
                .into_iter()
                .flatten()
                .filter(|part| !part.is_empty())
                .collect();
            return if parts.is_empty() {
                format!("{OVERLAY}{on}")
            } else {
                format!("{OVERLAY}{on} ({})", parts.join(", "))
            };
        }

        if !self.name.is_empty() {
            let parts: Vec<&str> = [self.model.as_deref(), Some(self.transport.as_str()), rotational]
                .into_iter()
                .flatten()
                .collect();
            let filesystem = if self.filesystem == UNKNOWN { "" } else { self.filesystem.as_str() };
            let mut line = format!("{} ({})", self.name, parts.join(", "));
            if !filesystem.is_empty() {
                line.push(' ');
                line.push_str(filesystem);
            }
            line.push_str(&on);
            return line;
        }

        let short = self.filesystem.strip_prefix("fuse.").unwrap_or(&self.filesystem);
        if self.transport == OBJECT_STORE {
            format!("object store (S3 API) at {}", self.mount_point)
        } else if self.transport.starts_with("network") {
            format!("network file system ({short}){on}")
        } else if self.transport.starts_with("host share") {
            format!("host share ({short}){on}")
        } else if self.transport == MEMORY {
            format!("{} in memory{on}", self.filesystem)
        } else if self.transport.starts_with("FUSE") {
            format!("FUSE file system ({short}){on}")
        } else if self.transport == UNKNOWN && self.filesystem == UNKNOWN {
            format!("unknown storage{on}")
        } else if self.transport == UNKNOWN {
            format!("{}{on} (storage unknown)", self.filesystem)
        } else {
            format!("{}{on} ({})", self.filesystem, self.transport)
        }
    }
}

/// Labels the storage under `path` on this machine (uses "/sys" and "/proc/self/mountinfo").
/// Never fails: unknown parts are None/"unknown". A path that does not exist yet is labelled by
/// its nearest existing ancestor.
pub fn device_for(path: &Path) -> Device {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let canonical = canonical_or_nearest(&absolute);
    let dev = absolute
        .ancestors()
        .find_map(|p| fs::metadata(p).ok())
        .map(|m| {
            let dev = m.dev();
            (libc::major(dev), libc::minor(dev))
        })
        .unwrap_or((0, 0));
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    device_in(&canonical, dev, Path::new("/sys"), &mountinfo)
}

/// The same from an explicit sysfs root and mountinfo text, so tests can use a fake sysfs tree.
/// `dev` is the st_dev (major, minor) of the path. `path` is canonicalized if it exists on this
/// machine, else only made absolute.
pub fn device_in(path: &Path, dev: (u32, u32), sys_root: &Path, mountinfo: &str) -> Device {
    let path = fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .map(|p| normalize(&p))
        .unwrap_or_else(|_| path.to_path_buf());
    let mounts = parse_mountinfo(mountinfo);
    let mount = find_mount(&mounts, &path, Some(dev));

    let filesystem = mount.map_or_else(|| UNKNOWN.to_string(), |m| m.fstype.clone());
    let mount_point = mount.map(|m| m.mount_point_text.clone()).unwrap_or_default();
    let mut device = Device {
        name: String::new(),
        partition: None,
        model: None,
        rotational: None,
        transport: UNKNOWN.to_string(),
        filesystem,
        mount_point,
    };

    if let Some(overlay) = mount.filter(|m| m.fstype == "overlay") {
        // Reads come from the layers; name the device that holds the upper dir when this mount
        // namespace can see it, else the device st_dev points at (non-directories on some
        // kernels report the real layer's device), else nothing.
        let upper = overlay
            .option("upperdir")
            .and_then(|upper| find_mount(&mounts, Path::new(&upper), None).filter(|m| m.id != overlay.id))
            .filter(|m| m.fstype != "overlay");
        let block = match upper {
            Some(m) => mount_block(sys_root, m, None),
            None if dev.0 != 0 => block_for_dev(sys_root, dev),
            None => None,
        };
        device.transport = match (&block, upper) {
            (Some(b), Some(_)) => format!("{OVERLAY} (upper dir on {}, {})", b.name, b.transport),
            (Some(b), None) => format!("{OVERLAY} (layer on {}, {})", b.name, b.transport),
            (None, Some(m)) => format!("{OVERLAY} (upper dir on {})", m.fstype),
            (None, None) => OVERLAY.to_string(),
        };
        if let Some(b) = block {
            device.name = b.name;
            device.partition = b.partition;
            device.model = b.model;
            device.rotational = b.rotational;
        }
        return device;
    }

    let block = match mount {
        Some(m) => mount_block(sys_root, m, Some(dev)),
        None if dev.0 != 0 => block_for_dev(sys_root, dev),
        None => None,
    };
    match block {
        Some(b) => {
            device.name = b.name;
            device.partition = b.partition;
            device.model = b.model;
            device.rotational = b.rotational;
            device.transport = b.transport;
        }
        None => {
            let source = mount.map(|m| m.source.as_str()).unwrap_or_default();
            device.transport = transport_without_block(&device.filesystem, source);
        }
    }
    device
}

/// The transport of a file system that has no block device behind it.
fn transport_without_block(fstype: &str, source: &str) -> String {
    const NETWORK: &[&str] = &[
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "afs",
        "beegfs",
        "gpfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.ceph-fuse",
        "fuse.gcsfuse",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.goofys",
        "fuse.mountpoint-s3",
        "fuse.blobfuse",
        "fuse.blobfuse2",
    ];
    let short = fstype.strip_prefix("fuse.").unwrap_or(fstype);
    if NETWORK.contains(&fstype) {
        format!("network ({short})")
    } else if matches!(fstype, "virtiofs" | "9p") {
        format!("host share ({fstype})")
    } else if matches!(fstype, "tmpfs" | "ramfs") {
        MEMORY.to_string()
    } else if fstype == "overlay" {
        OVERLAY.to_string()
    } else if fstype == "zfs" {
        match source.split('/').next().filter(|pool| !pool.is_empty()) {
            Some(pool) => format!("ZFS pool ({pool})"),
            None => "ZFS pool".to_string(),
        }
    } else if let Some(kind) = fstype.strip_prefix("fuse.") {
        format!("FUSE ({kind})")
    } else if fstype == "fuse" {
        "FUSE".to_string()
    } else {
        UNKNOWN.to_string()
    }
}

/// One line of `/proc/self/mountinfo` (see proc(5)).
#[derive(Debug)]
struct MountEntry {
    id: String,
    dev: (u32, u32),
    mount_point: PathBuf,
    mount_point_text: String,
    fstype: String,
    source: String,
    /// Still escaped: options are split on ',' before unescaping.
    super_options: String,
}

impl MountEntry {
    /// The unescaped value of `name=value` in the per-superblock options.
    fn option(&self, name: &str) -> Option<PathBuf> {
        self.super_options.split(',').find_map(|option| {
            let (key, value) = option.split_once('=')?;
            (key == name).then(|| PathBuf::from(OsString::from_vec(unescape(value))))
        })
    }
}

/// Parses mountinfo text, skipping malformed lines.
fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let raw_mount_point = unescape(fields.get(4)?);
    Some(MountEntry {
        id: fields.first()?.to_string(),
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mount_point_text: String::from_utf8_lossy(&raw_mount_point).into_owned(),
        mount_point: PathBuf::from(OsString::from_vec(raw_mount_point)),
        fstype: String::from_utf8_lossy(&unescape(fields.get(separator + 1)?)).into_owned(),
        source: String::from_utf8_lossy(&unescape(fields.get(separator + 2).unwrap_or(&""))).into_owned(),
        super_options: fields.get(separator + 3).unwrap_or(&"").to_string(),
    })
}

/// Undoes the kernel's octal escaping in mountinfo (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash, and any other `\ooo`).
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// The mount holding `path`: the longest mount point that is a prefix of `path` among mounts of
/// device `dev`; failing that (btrfs subvolumes, bind mounts, overlay non-directories report
/// another st_dev) among all mounts; failing that the last mount of `dev`. Of equal mount
/// points the last one wins, as later mounts hide earlier ones.
fn find_mount<'a>(mounts: &'a [MountEntry], path: &Path, dev: Option<(u32, u32)>) -> Option<&'a MountEntry> {
    let longest = |same_dev: bool| {
        mounts
            .iter()
            .filter(|m| !same_dev || Some(m.dev) == dev)
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
    };
    dev.and_then(|_| longest(true))
        .or_else(|| longest(false))
        .or_else(|| mounts.iter().rev().find(|m| Some(m.dev) == dev))
}

/// What sysfs says about a block device.
#[derive(Debug, Default)]
struct BlockInfo {
    name: String,
    partition: Option<String>,
    model: Option<String>,
    rotational: Option<bool>,
    transport: String,
}

/// The block device of a mount: the path's own st_dev first, then the mount's device, then the
/// mount source when it names a `/dev` node (btrfs and fuseblk mounts have anonymous devices).
fn mount_block(sys_root: &Path, mount: &MountEntry, dev: Option<(u32, u32)>) -> Option<BlockInfo> {
    dev.filter(|d| d.0 != 0)
        .and_then(|d| block_for_dev(sys_root, d))
        .or_else(|| Some(mount.dev).filter(|d| d.0 != 0).and_then(|d| block_for_dev(sys_root, d)))
        .or_else(|| block_for_source(sys_root, &mount.source))
}

fn block_for_dev(sys_root: &Path, (major, minor): (u32, u32)) -> Option<BlockInfo> {
    let dir = resolve_link(&sys_root.join("dev/block").join(format!("{major}:{minor}")))?;
    block_from_dir(sys_root, &dir)
}

/// `/dev/nvme0n1p2` via `class/block/nvme0n1p2`; `/dev/mapper/NAME` via `block/dm-*/dm/name`.
fn block_for_source(sys_root: &Path, source: &str) -> Option<BlockInfo> {
    let node = source.strip_prefix("/dev/")?;
    if let Some(mapped) = node.strip_prefix("mapper/") {
        let entries = fs::read_dir(sys_root.join("block")).ok()?;
        let dir = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("dm-"))
            .find(|e| read_trimmed(&e.path().join("dm/name")).as_deref() == Some(mapped))
            .and_then(|e| resolve_link(&e.path()))?;
        return block_from_dir(sys_root, &dir);
    }
    if node.is_empty() || node.contains('/') {
        return None;
    }
    block_from_dir(sys_root, &resolve_link(&sys_root.join("class/block").join(node))?)
}

/// A disk that holds data for a stacked device.
#[derive(Debug)]
struct Leaf {
    name: String,
    model: Option<String>,
    rotational: Option<bool>,
}

/// Reads a resolved `sys/devices/.../block/DISK[/PART]` directory.
fn block_from_dir(sys_root: &Path, dir: &Path) -> Option<BlockInfo> {
    let (disk_dir, partition) = whole_disk(dir)?;
    let name = file_name(&disk_dir)?;
    let mut info = BlockInfo {
        partition,
        model: read_model(&disk_dir, &name),
        rotational: read_rotational(&disk_dir),
        transport: UNKNOWN.to_string(),
        name,
    };
    // Only the part below the sysfs root is about the device; the root itself may be anywhere.
    let sys_path = disk_dir.strip_prefix(sys_root).unwrap_or(&disk_dir).to_string_lossy().into_owned();
    let name = info.name.as_str();

    if name.starts_with("nvme") {
        info.transport = "NVMe".into();
    } else if name.starts_with("vd") {
        info.transport = "virtio".into();
    } else if name.starts_with("xvd") {
        info.transport = "Xen virtual".into();
    } else if name.starts_with("mmcblk") {
        info.transport = "MMC".into();
    } else if name.starts_with("loop") {
        info.transport = match read_trimmed(&disk_dir.join("loop/backing_file")) {
            Some(file) => format!("loop (backing file {file})"),
            None => "loop".into(),
        };
    } else if name.starts_with("dm-") || name.starts_with("md") {
        let leaves = leaves(sys_root, &disk_dir, 0);
        let on: Vec<&str> = leaves.iter().map(|l| l.name.as_str()).collect();
        let on = if on.is_empty() { String::new() } else { format!("on {}", on.join(", ")) };
        info.transport = if name.starts_with("dm-") {
            if on.is_empty() {
                "device-mapper".to_string()
            } else {
                format!("device-mapper ({on})")
            }
        } else {
            let level = read_trimmed(&disk_dir.join("md/level"));
            let detail: Vec<&str> =
                ["md", level.as_deref().unwrap_or(""), &on].into_iter().filter(|s| !s.is_empty()).collect();
            format!("software RAID ({})", detail.join(" "))
        };
        // A stacked device's own queue flags say little; the disks holding the data do.
        if let Some(first) = leaves.first() {
            let agreed = leaves.iter().all(|l| l.rotational == first.rotational);
            info.rotational = if agreed { first.rotational } else { None };
            if leaves.len() == 1 {
                info.model.clone_from(&first.model);
            }
        }
    } else if name.starts_with("sd") || name.starts_with("sr") {
        info.transport = if sys_path.contains("/usb") {
            "USB"
        } else if sys_path.contains("/ata") {
            "SATA"
        } else if sys_path.contains("/virtio") {
            "virtio-scsi"
        } else if sys_path.contains("/session") {
            "network (iSCSI)"
        } else {
            "SATA/SCSI"
        }
        .into();
    } else if name.starts_with("ram") || name.starts_with("zram") {
        info.transport = "RAM disk".into();
    } else if name.starts_with("nbd") {
        info.transport = "network (nbd)".into();
    } else if name.starts_with("rbd") {
        info.transport = "network (rbd)".into();
    }
    Some(info)
}

/// The whole disk's directory and, for a partition, the partition's name.
fn whole_disk(dir: &Path) -> Option<(PathBuf, Option<String>)> {
    if dir.join("partition").is_file() {
        Some((dir.parent()?.to_path_buf(), Some(file_name(dir)?)))
    } else {
        Some((dir.to_path_buf(), None))
    }
}

/// The disks under a device-mapper or md device, following `slaves/` through further stacked
/// devices (LVM on LUKS on a partition...). Partitions become their disks; duplicates are
/// dropped; order is by name so results are stable.
fn leaves(sys_root: &Path, disk_dir: &Path, depth: usize) -> Vec<Leaf> {
    let mut out: Vec<Leaf> = Vec::new();
    let Ok(entries) = fs::read_dir(disk_dir.join("slaves")) else { return out };
    let mut slaves: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    slaves.sort();
    for slave in slaves {
        let resolved = resolve_link(&slave)
            .filter(|p| p.is_dir())
            .or_else(|| resolve_link(&sys_root.join("class/block").join(slave.file_name()?)));
        let Some((dir, _)) = resolved.as_deref().and_then(whole_disk) else { continue };
        let Some(name) = file_name(&dir) else { continue };
        let found = if (name.starts_with("dm-") || name.starts_with("md")) && depth < 8 {
            leaves(sys_root, &dir, depth + 1)
        } else {
            vec![Leaf { model: read_model(&dir, &name), rotational: read_rotational(&dir), name }]
        };
        for leaf in found {
            if !out.iter().any(|l| l.name == leaf.name) {
                out.push(leaf);
            }
        }
    }
    out
}

/// `device/model`, prefixed by `device/vendor` when that says something the model does not
/// (libata's placeholder vendor "ATA" and PCI ids like "0x1af4" say nothing); for MMC cards the
/// name is in `device/name`.
fn read_model(disk_dir: &Path, name: &str) -> Option<String> {
    let device = disk_dir.join("device");
    let model = read_trimmed(&device.join("model"))
        .or_else(|| name.starts_with("mmcblk").then(|| read_trimmed(&device.join("name"))).flatten())?;
    let vendor = read_trimmed(&device.join("vendor")).filter(|vendor| {
        vendor != "ATA" && !vendor.starts_with("0x") && !model.to_lowercase().contains(&vendor.to_lowercase())
    });
    Some(match vendor {
        Some(vendor) => format!("{vendor} {model}"),
        None => model,
    })
}

fn read_rotational(disk_dir: &Path) -> Option<bool> {
    match read_trimmed(&disk_dir.join("queue/rotational"))?.as_str() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// A sysfs attribute, trimmed; `None` if missing, unreadable or blank.
fn read_trimmed(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn file_name(path: &Path) -> Option<String> {
    Some(path.file_name()?.to_string_lossy().into_owned())
}

/// Where a sysfs symlink points, resolved lexically against the link's directory (sysfs links
/// are relative, e.g. `../../devices/pci0000:00/.../block/sda/sda1`). Not a symlink: the path
/// itself if it exists.
fn resolve_link(link: &Path) -> Option<PathBuf> {
    match fs::read_link(link) {
        Ok(target) if target.is_absolute() => Some(normalize(&target)),
        Ok(target) => Some(normalize(&link.parent()?.join(target))),
        Err(_) => link.exists().then(|| link.to_path_buf()),
    }
}

/// Removes `.` and resolves `..` lexically (correct for sysfs, whose directories under
/// `devices/` are not symlinks).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(component);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The canonical form of `path`, or of its nearest existing ancestor with the rest appended.
fn canonical_or_nearest(path: &Path) -> PathBuf {
    for ancestor in path.ancestors() {
        if let Ok(canonical) = fs::canonicalize(ancestor) {
            let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
            return normalize(&canonical.join(rest));
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tempfile::TempDir;

    /// A fake sysfs tree.
    struct Sys {
        root: TempDir,
    }

    impl Sys {
        fn new() -> Self {
            Sys { root: TempDir::new().unwrap() }
        }

        fn path(&self) -> &Path {
            self.root.path()
        }

        /// Creates `devices/<dir>` holding `files` (relative path, content).
        fn dir(&self, dir: &str, files: &[(&str, &str)]) -> PathBuf {
            let full = self.path().join("devices").join(dir);
            fs::create_dir_all(&full).unwrap();
            for (file, content) in files {
                let file = full.join(file);
                fs::create_dir_all(file.parent().unwrap()).unwrap();
                fs::write(file, content).unwrap();
            }
            full
        }

        /// `dev/block/MAJ:MIN -> ../../devices/<dir>`, as the kernel lays it out.
        fn dev_link(&self, maj_min: &str, dir: &str) {
            let links = self.path().join("dev/block");
            fs::create_dir_all(&links).unwrap();
            symlink(format!("../../devices/{dir}"), links.join(maj_min)).unwrap();
        }

        /// `class/block/NAME -> ../../devices/<dir>`.
        fn class_link(&self, name: &str, dir: &str) {
            let links = self.path().join("class/block");
            fs::create_dir_all(&links).unwrap();
            symlink(format!("../../devices/{dir}"), links.join(name)).unwrap();
        }

        fn symlink(&self, target: &str, link: &str) {
            let link = self.path().join(link);
            fs::create_dir_all(link.parent().unwrap()).unwrap();
            symlink(target, link).unwrap();
        }
    }

    const NVME: &str = "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1";

    fn nvme(sys: &Sys) {
        sys.dir(
            "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0",
            &[("model", "Samsung SSD 980 PRO 1TB          \n")],
        );
        sys.dir(NVME, &[("queue/rotational", "0\n")]);
        sys.symlink("../../nvme0", &format!("devices/{NVME}/device"));
        sys.dir(&format!("{NVME}/nvme0n1p2"), &[("partition", "2\n")]);
        sys.dev_link("259:2", &format!("{NVME}/nvme0n1p2"));
    }

    const VDA: &str = "pci0000:00/0000:00:02.0/virtio1/block/vda";

    fn vda(sys: &Sys) {
        sys.dir(VDA, &[("queue/rotational", "1\n"), ("device/vendor", "0x1af4\n")]);
        sys.dev_link("254:0", VDA);
    }

    #[test]
    fn nvme_partition() {
        let sys = Sys::new();
        nvme(&sys);
        let mountinfo = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 27 259:2 / /data rw,relatime shared:2 - ext4 /dev/nvme0n1p2 rw
";
        let d = device_in(Path::new("/data/imagenet/train.lmdb"), (259, 2), sys.path(), mountinfo);
        assert_eq!(d.name, "nvme0n1");
        assert_eq!(d.partition.as_deref(), Some("nvme0n1p2"));
        assert_eq!(d.model.as_deref(), Some("Samsung SSD 980 PRO 1TB"));
        assert_eq!(d.transport, "NVMe");
        assert_eq!(d.rotational, Some(false));
        assert_eq!(d.filesystem, "ext4");
        assert_eq!(d.mount_point, "/data");
        assert_eq!(d.describe(), "nvme0n1 (Samsung SSD 980 PRO 1TB, NVMe, non-rotational) ext4 on /data");
    }

    #[test]
    fn sata_hdd_partition() {
        let sys = Sys::new();
        let scsi = "pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0";
        sys.dir(scsi, &[("vendor", "ATA     \n"), ("model", "WDC WD40EFRX    \n")]);
        let disk = format!("{scsi}/block/sda");
        sys.dir(&disk, &[("queue/rotational", "1\n")]);
        sys.symlink("../../../0:0:0:0", &format!("devices/{disk}/device"));
        sys.dir(&format!("{disk}/sda1"), &[("partition", "1\n")]);
        sys.dev_link("8:1", &format!("{disk}/sda1"));
        let mountinfo = "29 1 8:1 / /mnt/archive rw,noatime shared:5 - ext4 /dev/sda1 rw,errors=remount-ro\n";
        let d = device_in(Path::new("/mnt/archive/train"), (8, 1), sys.path(), mountinfo);
        assert_eq!(d.name, "sda");
        assert_eq!(d.partition.as_deref(), Some("sda1"));
        assert_eq!(d.transport, "SATA");
        assert_eq!(d.rotational, Some(true));
        // "ATA" is libata's placeholder vendor, not a maker: left out.
        assert_eq!(d.model.as_deref(), Some("WDC WD40EFRX"));
        assert!(d.describe().contains("rotational) ext4 on /mnt/archive"), "{}", d.describe());
    }

    #[test]
    fn usb_disk_gets_vendor_prefix() {
        let sys = Sys::new();
        let scsi = "pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0";
        sys.dir(scsi, &[("vendor", "Samsung \n"), ("model", "PSSD T7         \n")]);
        let disk = format!("{scsi}/block/sdb");
        sys.dir(&disk, &[("queue/rotational", "0\n")]);
        sys.symlink("../../../6:0:0:0", &format!("devices/{disk}/device"));
        sys.dev_link("8:16", &disk);
        let mountinfo = "50 27 8:16 / /media/usb rw - exfat /dev/sdb rw\n";
        let d = device_in(Path::new("/media/usb/x"), (8, 16), sys.path(), mountinfo);
        assert_eq!((d.name.as_str(), d.partition.as_deref()), ("sdb", None));
        assert_eq!(d.transport, "USB");
        assert_eq!(d.model.as_deref(), Some("Samsung PSSD T7"));
    }

    #[test]
    fn virtio_disk() {
        let sys = Sys::new();
        vda(&sys);
        let mountinfo = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
";
        let d = device_in(Path::new("/home/user/data"), (254, 0), sys.path(), mountinfo);
        assert_eq!(d.name, "vda");
        assert_eq!(d.partition, None);
        assert_eq!(d.model, None, "a PCI vendor id alone is not a model");
        assert_eq!(d.transport, "virtio");
        assert_eq!(d.rotational, Some(true));
        assert_eq!(d.describe(), "vda (virtio, rotational) ext4 on /");
    }

    #[test]
    fn overlay_names_upper_dir_device() {
        let sys = Sys::new();
        vda(&sys);
        let mountinfo = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
412 27 0:52 / /merged rw,relatime shared:200 - overlay overlay rw,lowerdir=/var/lib/ov/l1:/var/lib/ov/l2,upperdir=/var/lib/ov/upper,workdir=/var/lib/ov/work
";
        let d = device_in(Path::new("/merged/data"), (0, 52), sys.path(), mountinfo);
        assert_eq!(d.filesystem, "overlay");
        assert_eq!(d.mount_point, "/merged");
        assert!(d.transport.starts_with("overlay file system"), "{}", d.transport);
        assert_eq!(d.transport, "overlay file system (upper dir on vda, virtio)");
        assert_eq!(d.name, "vda");
        assert_eq!(d.rotational, Some(true));
        assert_eq!(d.describe(), "overlay file system on /merged (upper dir on vda, virtio, rotational)");
    }

    #[test]
    fn overlay_in_container_without_visible_upper_dir() {
        let sys = Sys::new();
        vda(&sys);
        // Inside a container the upper dir is a host path this namespace cannot see; the only
        // prefix is the overlay itself, which must not be taken as its own upper dir.
        let mountinfo = "\
600 550 0:60 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/A,upperdir=/var/lib/docker/overlay2/x/diff,workdir=/var/lib/docker/overlay2/x/work
601 600 0:61 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
";
        let d = device_in(Path::new("/workspace/data"), (0, 60), sys.path(), mountinfo);
        assert_eq!(d.transport, "overlay file system");
        assert_eq!(d.name, "");
        assert_eq!(d.describe(), "overlay file system on /");
    }

    #[test]
    fn nfs4_has_no_block_device() {
        let sys = Sys::new();
        vda(&sys);
        let mountinfo = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
45 27 0:50 / /mnt/datasets rw,relatime shared:30 - nfs4 fileserver:/export/datasets rw,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,addr=10.0.0.5
";
        let d = device_in(Path::new("/mnt/datasets/imagenet"), (0, 50), sys.path(), mountinfo);
        assert_eq!(d.transport, "network (nfs4)");
        assert_eq!(d.name, "");
        assert_eq!(d.rotational, None);
        assert_eq!(d.filesystem, "nfs4");
        assert_eq!(d.describe(), "network file system (nfs4) on /mnt/datasets");
    }

    #[test]
    fn tmpfs_and_host_share() {
        let sys = Sys::new();
        let mountinfo = "\
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684096k
60 1 0:70 / /mnt/host rw,relatime - virtiofs myshare rw
";
        let d = device_in(Path::new("/dev/shm/x"), (0, 23), sys.path(), mountinfo);
        assert_eq!(d.transport, "tmpfs (memory)");
        assert_eq!(d.describe(), "tmpfs in memory on /dev/shm");
        let d = device_in(Path::new("/mnt/host/x"), (0, 70), sys.path(), mountinfo);
        assert_eq!(d.transport, "host share (virtiofs)");
    }

    #[test]
    fn escaped_mount_point() {
        let sys = Sys::new();
        vda(&sys);
        let mountinfo = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
88 27 254:0 /srv /mnt/my\\040data rw,relatime - ext4 /dev/vda rw
";
        let d = device_in(Path::new("/mnt/my data/train"), (254, 0), sys.path(), mountinfo);
        assert_eq!(d.mount_point, "/mnt/my data");
        assert_eq!(d.name, "vda");
        // A sibling whose name merely starts with the mount point is not under it.
        let d = device_in(Path::new("/mnt/my data2/x"), (254, 0), sys.path(), mountinfo);
        assert_eq!(d.mount_point, "/");
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape(r"/a\040b\011c\012d\134e"), b"/a b\tc\nd\\e");
        assert_eq!(unescape(r"/trailing\04"), b"/trailing\\04");
    }

    #[test]
    fn device_mapper_follows_slaves() {
        let sys = Sys::new();
        nvme(&sys);
        let dm = "virtual/block/dm-0";
        sys.dir(dm, &[("queue/rotational", "1\n"), ("dm/name", "vg0-root\n")]);
        sys.symlink(&format!("../../../../{NVME}/nvme0n1p2"), &format!("devices/{dm}/slaves/nvme0n1p2"));
        sys.dev_link("252:0", dm);
        let mountinfo = "27 1 252:0 / / rw,relatime - xfs /dev/mapper/vg0-root rw\n";
        let d = device_in(Path::new("/srv"), (252, 0), sys.path(), mountinfo);
        assert_eq!(d.name, "dm-0");
        assert_eq!(d.transport, "device-mapper (on nvme0n1)");
        assert_eq!(d.rotational, Some(false), "taken from the NVMe disk, not dm's own flag");
        assert_eq!(d.model.as_deref(), Some("Samsung SSD 980 PRO 1TB"));
    }

    #[test]
    fn btrfs_subvolume_found_through_mount_source() {
        let sys = Sys::new();
        nvme(&sys);
        sys.class_link("nvme0n1p2", &format!("{NVME}/nvme0n1p2"));
        // st_dev of a btrfs subvolume is anonymous and differs from the mount's.
        let mountinfo = "31 1 0:45 /@home /home rw,relatime - btrfs /dev/nvme0n1p2 rw,ssd,subvol=/@home\n";
        let d = device_in(Path::new("/home/me/data"), (0, 48), sys.path(), mountinfo);
        assert_eq!(d.filesystem, "btrfs");
        assert_eq!(d.name, "nvme0n1");
        assert_eq!(d.transport, "NVMe");
    }

    #[test]
    fn loop_device_with_backing_file() {
        let sys = Sys::new();
        sys.dir(
            "virtual/block/loop3",
            &[("queue/rotational", "0\n"), ("loop/backing_file", "/data/ds.img\n")],
        );
        sys.dev_link("7:3", "virtual/block/loop3");
        let mountinfo = "70 27 7:3 / /mnt/ds ro,relatime - squashfs /dev/loop3 ro\n";
        let d = device_in(Path::new("/mnt/ds/a"), (7, 3), sys.path(), mountinfo);
        assert_eq!(d.transport, "loop (backing file /data/ds.img)");
    }

    #[test]
    fn nothing_known_is_still_a_device() {
        let sys = Sys::new();
        let d = device_in(Path::new("/x"), (8, 1), sys.path(), "garbage line\n");
        assert_eq!(d.filesystem, "unknown");
        assert_eq!(d.transport, "unknown");
        assert_eq!(d.name, "");
        assert_eq!(d.describe(), "unknown storage");
    }

    #[test]
    fn device_for_real_temp_file() {
        let dir = TempDir::new().unwrap();
        let file = dir.path().join("sample.bin");
        fs::write(&file, b"x").unwrap();
        let d = device_for(&file);
        assert!(!d.filesystem.is_empty());
        assert!(!d.describe().is_empty());
        if fs::read_to_string("/proc/self/mountinfo").is_ok() {
            assert_ne!(d.filesystem, "unknown", "{d:?}");
            let canonical = fs::canonicalize(&file).unwrap();
            assert!(canonical.starts_with(&d.mount_point), "{d:?} for {}", canonical.display());
        }
        // A path that does not exist yet is labelled by its nearest existing ancestor.
        let missing = device_for(&dir.path().join("not/yet/created"));
        assert_eq!(missing.filesystem, d.filesystem);
        assert_eq!(missing.mount_point, d.mount_point);
    }
}
