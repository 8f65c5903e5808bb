//! What a YCSB workload is: the core-workload properties, the six standard workloads and the
//! parser of YCSB property files (`-P workloada`).

use std::fmt;
use std::path::Path;

use super::YcsbError;
use super::generator::ZIPFIAN_CONSTANT;

/// How run-phase keys are chosen (YCSB `requestdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestDistribution {
    /// Every loaded key equally likely.
    Uniform,
    /// Scrambled zipfian: a few keys, scattered over the key space, are hot.
    Zipfian,
    /// Skewed towards the most recently inserted (and acknowledged) keys.
    Latest,
}

impl RequestDistribution {
    /// The name YCSB uses in property files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Zipfian => "zipfian",
            Self::Latest => "latest",
        }
    }
}

/// How scan lengths are chosen (YCSB `scanlengthdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanLengthDistribution {
    /// Uniform over `minscanlength..=maxscanlength`.
    Uniform,
    /// Zipfian over `minscanlength..=maxscanlength` (short scans most likely).
    Zipfian,
}

impl ScanLengthDistribution {
    /// The name YCSB uses in property files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Zipfian => "zipfian",
        }
    }
}

/// How key numbers become key names (YCSB `insertorder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOrder {
    /// `"user" + fnvhash64(keynum)`: inserts land all over an ordered key space.
    Hashed,
    /// `"user" + keynum`.
    Ordered,
}

impl InsertOrder {
    /// The name YCSB uses in property files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hashed => "hashed",
            Self::Ordered => "ordered",
        }
    }
}

/// A YCSB core workload: the record set to load and the operation mix to run.
///
/// Values are the concatenation of `field_count` fields of `field_length` bytes; updates and
/// read-modify-writes write the whole record (as YCSB with `writeallfields=true`), since our
/// stores map a key to one value.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// Records loaded before the run phase (`recordcount`).
    pub record_count: u64,
    /// Operations in the run phase (`operationcount`); also sizes the zipfian key space for
    /// expected inserts, as YCSB does.
    pub operation_count: u64,
    /// Weight of reads (`readproportion`).
    pub read_proportion: f64,
    /// Weight of updates (`updateproportion`).
    pub update_proportion: f64,
    /// Weight of inserts (`insertproportion`).
    pub insert_proportion: f64,
    /// Weight of scans (`scanproportion`).
    pub scan_proportion: f64,
    /// Weight of read-modify-writes (`readmodifywriteproportion`).
    pub read_modify_write_proportion: f64,
    /// Key popularity (`requestdistribution`).
    pub request_distribution: RequestDistribution,
    /// Skew of the zipfian and latest distributions (`zipfianconstant`), in (0, 1).
    pub zipfian_constant: f64,
    /// Fields per record (`fieldcount`).
    pub field_count: u32,
    /// Bytes per field (`fieldlength`).
    pub field_length: u32,
    /// Shortest scan (`minscanlength`).
    pub min_scan_length: u64,
    /// Longest scan (`maxscanlength`).
    pub max_scan_length: u64,
    /// Scan length distribution (`scanlengthdistribution`).
    pub scan_length_distribution: ScanLengthDistribution,
    /// Key naming (`insertorder`).
    pub insert_order: InsertOrder,
    /// First key number of the load phase (`insertstart`).
    pub insert_start: u64,
    /// Keys this loader inserts (`insertcount`); `None` means `record_count - insert_start`.
    pub insert_count: Option<u64>,
}

impl Default for WorkloadSpec {
    /// YCSB's CoreWorkload defaults, with the standard files' 1000 records and operations.
    fn default() -> Self {
        Self {
            record_count: 1000,
            operation_count: 1000,
            read_proportion: 0.95,
            update_proportion: 0.05,
            insert_proportion: 0.0,
            scan_proportion: 0.0,
            read_modify_write_proportion: 0.0,
            request_distribution: RequestDistribution::Uniform,
            zipfian_constant: ZIPFIAN_CONSTANT,
            field_count: 10,
            field_length: 100,
            min_scan_length: 1,
            max_scan_length: 1000,
            scan_length_distribution: ScanLengthDistribution::Uniform,
            insert_order: InsertOrder::Hashed,
            insert_start: 0,
            insert_count: None,
        }
    }
}

/// A property the parser did not use, with where it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertyWarning {
    /// 1-based line of the property.
    pub line: usize,
    /// The property name.
    pub key: String,
    /// Why it was ignored.
    pub message: String,
}

impl fmt::Display for PropertyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: `{}`: {}", self.line, self.key, self.message)
    }
}

/// The largest record (`fieldcount * fieldlength`) a workload may ask for: 1 GiB.
const MAX_RECORD_BYTES: u64 = 1 << 30;

/// Properties that only concern YCSB's client or measurement, accepted without a warning.
const CLIENT_ONLY: &[&str] = &[
    "readallfields",
    "table",
    "threadcount",
    "db",
    "exporter",
    "exportfile",
    "measurementtype",
    "status.interval",
    "histogram.buckets",
    "timeseries.granularity",
    "target",
    "maxexecutiontime",
];

/// The workload class names that mean "core workload".
const CORE_WORKLOAD: &[&str] = &[
    "site.ycsb.workloads.CoreWorkload",
    "com.yahoo.ycsb.workloads.CoreWorkload",
    "CoreWorkload",
];

impl WorkloadSpec {
    /// One of the six standard YCSB workloads, `'a'` to `'f'` (either case), as in YCSB's
    /// `workloads/workloada` … `workloadf`:
    ///
    /// | | mix | keys |
    /// |---|---|---|
    /// | A | 50% read, 50% update | zipfian |
    /// | B | 95% read, 5% update | zipfian |
    /// | C | 100% read | zipfian |
    /// | D | 95% read, 5% insert | latest |
    /// | E | 95% scan (uniform length up to 100), 5% insert | zipfian |
    /// | F | 50% read, 50% read-modify-write | zipfian |
    pub fn standard(name: char) -> Result<Self, YcsbError> {
        let base = Self {
            read_proportion: 0.0,
            update_proportion: 0.0,
            request_distribution: RequestDistribution::Zipfian,
            ..Self::default()
        };
        Ok(match name.to_ascii_lowercase() {
            'a' => Self {
                read_proportion: 0.5,
                update_proportion: 0.5,
                ..base
            },
            'b' => Self {
                read_proportion: 0.95,
                update_proportion: 0.05,
                ..base
            },
            'c' => Self {
                read_proportion: 1.0,
                ..base
            },
            'd' => Self {
                read_proportion: 0.95,
                insert_proportion: 0.05,
                request_distribution: RequestDistribution::Latest,
                ..base
            },
            'e' => Self {
                scan_proportion: 0.95,
                insert_proportion: 0.05,
                max_scan_length: 100,
                scan_length_distribution: ScanLengthDistribution::Uniform,
                ..base
            },
            'f' => Self {
                read_proportion: 0.5,
                read_modify_write_proportion: 0.5,
                ..base
            },
            _ => return Err(YcsbError::UnknownStandardWorkload(name)),
        })
    }

    /// The keys the load phase inserts: `insert_count`, or everything from `insert_start` on.
    pub fn effective_insert_count(&self) -> u64 {
        self.insert_count
            .unwrap_or(self.record_count.saturating_sub(self.insert_start))
    }

    /// Checks the values make a runnable workload.
    pub fn validate(&self) -> Result<(), YcsbError> {
        let invalid = |key: &'static str, reason: String| Err(YcsbError::Invalid { key, reason });
        if self.record_count == 0 {
            return invalid("recordcount", "must be at least 1".into());
        }
        if self.record_count > i64::MAX as u64 / 4 {
            return invalid("recordcount", format!("{} is too large", self.record_count));
        }
        let proportions = [
            ("readproportion", self.read_proportion),
            ("updateproportion", self.update_proportion),
            ("insertproportion", self.insert_proportion),
            ("scanproportion", self.scan_proportion),
            (
                "readmodifywriteproportion",
                self.read_modify_write_proportion,
            ),
        ];
        for (key, p) in proportions {
            if !p.is_finite() || p < 0.0 {
                return invalid(key, format!("{p} is not a non-negative number"));
            }
        }
        if proportions.iter().map(|(_, p)| p).sum::<f64>() <= 0.0 {
            return invalid(
                "readproportion",
                "all operation proportions are zero".into(),
            );
        }
        let theta = self.zipfian_constant;
        if !(theta > 0.0 && theta < 1.0) {
            return invalid("zipfianconstant", format!("{theta} is not in (0, 1)"));
        }
        let insert_count = self.effective_insert_count();
        if insert_count == 0 {
            return invalid("insertcount", "no keys to load".into());
        }
        if self.insert_start.saturating_add(insert_count) > self.record_count {
            return invalid(
                "insertcount",
                format!(
                    "insertstart {} + insertcount {insert_count} exceeds recordcount {}",
                    self.insert_start, self.record_count
                ),
            );
        }
        if self.min_scan_length > self.max_scan_length {
            return invalid(
                "minscanlength",
                format!(
                    "{} exceeds maxscanlength {}",
                    self.min_scan_length, self.max_scan_length
                ),
            );
        }
        let record_bytes = u64::from(self.field_count) * u64::from(self.field_length);
        if record_bytes > MAX_RECORD_BYTES {
            return invalid(
                "fieldlength",
                format!("records of {record_bytes} bytes exceed the {MAX_RECORD_BYTES}-byte limit"),
            );
        }
        if self.max_scan_length > u32::MAX.into() {
            return invalid(
                "maxscanlength",
                format!("{} is too large", self.max_scan_length),
            );
        }
        Ok(())
    }

    /// Parses a YCSB property file (`key=value` or `key: value` lines, `#` and `!` comments,
    /// trailing-backslash continuations), starting from [`WorkloadSpec::default`].
    ///
    /// Returns the spec and the properties that were ignored. A value that does not parse is an
    /// error naming the key and line; so is a spec that fails [`WorkloadSpec::validate`].
    pub fn from_properties(text: &str) -> Result<(Self, Vec<PropertyWarning>), YcsbError> {
        let mut spec = Self::default();
        let mut warnings = Vec::new();
        for (line, key, value) in logical_lines(text)? {
            spec.apply(line, &key, &value, &mut warnings)?;
        }
        spec.validate()?;
        Ok((spec, warnings))
    }

    /// Reads and parses a YCSB property file; see [`WorkloadSpec::from_properties`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<(Self, Vec<PropertyWarning>), YcsbError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| YcsbError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_properties(&text)
    }

    /// Writes the spec as a YCSB property file that [`WorkloadSpec::from_properties`] (and YCSB,
    /// apart from `zipfianconstant`) reads back.
    pub fn to_properties(&self) -> String {
        let mut out = String::from("workload=site.ycsb.workloads.CoreWorkload\n");
        let mut put = |k: &str, v: String| {
            out.push_str(k);
            out.push('=');
            out.push_str(&v);
            out.push('\n');
        };
        put("recordcount", self.record_count.to_string());
        put("operationcount", self.operation_count.to_string());
        put("readproportion", self.read_proportion.to_string());
        put("updateproportion", self.update_proportion.to_string());
        put("insertproportion", self.insert_proportion.to_string());
        put("scanproportion", self.scan_proportion.to_string());
        put(
            "readmodifywriteproportion",
            self.read_modify_write_proportion.to_string(),
        );
        put(
            "requestdistribution",
            self.request_distribution.name().into(),
        );
        put("zipfianconstant", self.zipfian_constant.to_string());
        put("fieldcount", self.field_count.to_string());
        put("fieldlength", self.field_length.to_string());
        put("minscanlength", self.min_scan_length.to_string());
        put("maxscanlength", self.max_scan_length.to_string());
        put(
            "scanlengthdistribution",
            self.scan_length_distribution.name().into(),
        );
        put("insertorder", self.insert_order.name().into());
        put("insertstart", self.insert_start.to_string());
        if let Some(n) = self.insert_count {
            put("insertcount", n.to_string());
        }
        out
    }

    fn apply(
        &mut self,
        line: usize,
        key: &str,
        value: &str,
        warnings: &mut Vec<PropertyWarning>,
    ) -> Result<(), YcsbError> {
        let bad = |expected: &'static str| YcsbError::BadValue {
            key: key.to_string(),
            line,
            value: value.to_string(),
            expected,
        };
        let int = || {
            value
                .parse::<u64>()
                .map_err(|_| bad("non-negative integer"))
        };
        let int32 = || {
            value
                .parse::<u32>()
                .map_err(|_| bad("non-negative 32-bit integer"))
        };
        let real = || match value.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(bad("number")),
        };
        match key {
            "recordcount" => self.record_count = int()?,
            "operationcount" => self.operation_count = int()?,
            "readproportion" => self.read_proportion = real()?,
            "updateproportion" => self.update_proportion = real()?,
            "insertproportion" => self.insert_proportion = real()?,
            "scanproportion" => self.scan_proportion = real()?,
            "readmodifywriteproportion" => self.read_modify_write_proportion = real()?,
            "zipfianconstant" => self.zipfian_constant = real()?,
            "fieldcount" => self.field_count = int32()?,
            "fieldlength" => self.field_length = int32()?,
            "minscanlength" => self.min_scan_length = int()?,
            "maxscanlength" => self.max_scan_length = int()?,
            "insertstart" => self.insert_start = int()?,
            "insertcount" => self.insert_count = Some(int()?),
            "requestdistribution" => {
                self.request_distribution = match value {
                    "uniform" => RequestDistribution::Uniform,
                    "zipfian" => RequestDistribution::Zipfian,
                    "latest" => RequestDistribution::Latest,
                    _ => return Err(bad("request distribution (uniform, zipfian or latest)")),
                }
            }
            "scanlengthdistribution" => {
                self.scan_length_distribution = match value {
                    "uniform" => ScanLengthDistribution::Uniform,
                    "zipfian" => ScanLengthDistribution::Zipfian,
                    _ => return Err(bad("scan length distribution (uniform or zipfian)")),
                }
            }
            "insertorder" => {
                // YCSB treats anything but "hashed" as ordered.
                self.insert_order = if value == "hashed" {
                    InsertOrder::Hashed
                } else {
                    InsertOrder::Ordered
                }
            }
            "workload" => {
                if !CORE_WORKLOAD.contains(&value) {
                    return Err(bad("workload class (site.ycsb.workloads.CoreWorkload)"));
                }
            }
            k if CLIENT_ONLY.contains(&k) => {}
            _ => warnings.push(PropertyWarning {
                line,
                key: key.to_string(),
                message: "unknown or unsupported property, ignored".into(),
            }),
        }
        Ok(())
    }
}

/// Splits a Java-properties text into `(first line number, key, value)`, joining continuation
/// lines and skipping blanks and comments.
fn logical_lines(text: &str) -> Result<Vec<(usize, String, String)>, YcsbError> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, raw)) = lines.next() {
        let first = raw.trim_start();
        if first.is_empty() || first.starts_with('#') || first.starts_with('!') {
            continue;
        }
        let mut logical = first.to_string();
        while logical.ends_with('\\') && !logical.ends_with("\\\\") {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let split = logical
            .find(['=', ':'])
            .or_else(|| logical.find(char::is_whitespace));
        let Some(at) = split else {
            return Err(YcsbError::Syntax {
                line: index + 1,
                text: logical,
            });
        };
        let key = logical[..at].trim().to_string();
        let value = logical[at + 1..].trim().to_string();
        if key.is_empty() {
            return Err(YcsbError::Syntax {
                line: index + 1,
                text: logical,
            });
        }
        out.push((index + 1, key, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YCSB's own `workloads/workloada` … `workloadf`, comments trimmed.
    const YCSB_FILES: [(char, &str); 6] = [
        (
            'a',
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\nreadallfields=true\nreadproportion=0.5\nupdateproportion=0.5\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian\n",
        ),
        (
            'b',
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\nreadallfields=true\nreadproportion=0.95\nupdateproportion=0.05\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian\n",
        ),
        (
            'c',
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\nreadallfields=true\nreadproportion=1\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian\n",
        ),
        (
            'd',
            "# Workload D\n\nrecordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\n\nreadallfields=true\n\nreadproportion=0.95\nupdateproportion=0\nscanproportion=0\ninsertproportion=0.05\n\nrequestdistribution=latest\n",
        ),
        (
            'e',
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\nreadallfields=true\nreadproportion=0\nupdateproportion=0\nscanproportion=0.95\ninsertproportion=0.05\nrequestdistribution=zipfian\nmaxscanlength=100\nscanlengthdistribution=uniform\n",
        ),
        (
            'f',
            "recordcount=1000\noperationcount=1000\nworkload=site.ycsb.workloads.CoreWorkload\nreadallfields=true\nreadproportion=0.5\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\nreadmodifywriteproportion=0.5\nrequestdistribution=zipfian\n",
        ),
    ];

    #[test]
    fn standard_workloads_equal_ycsb_property_files() {
        for (name, text) in YCSB_FILES {
            let (parsed, warnings) = WorkloadSpec::from_properties(text).unwrap();
            assert!(warnings.is_empty(), "{name}: {warnings:?}");
            assert_eq!(
                parsed,
                WorkloadSpec::standard(name).unwrap(),
                "workload {name}"
            );
        }
        assert!(matches!(
            WorkloadSpec::standard('g'),
            Err(YcsbError::UnknownStandardWorkload('g'))
        ));
        assert_eq!(
            WorkloadSpec::standard('A').unwrap(),
            WorkloadSpec::standard('a').unwrap()
        );
    }

    #[test]
    fn properties_round_trip() {
        let spec = WorkloadSpec {
            record_count: 12_345,
            operation_count: 777,
            read_proportion: 0.25,
            update_proportion: 0.125,
            insert_proportion: 0.5,
            scan_proportion: 0.0625,
            read_modify_write_proportion: 0.0625,
            request_distribution: RequestDistribution::Latest,
            zipfian_constant: 0.7,
            field_count: 3,
            field_length: 17,
            min_scan_length: 2,
            max_scan_length: 9,
            scan_length_distribution: ScanLengthDistribution::Zipfian,
            insert_order: InsertOrder::Ordered,
            insert_start: 5,
            insert_count: Some(100),
        };
        let (back, warnings) = WorkloadSpec::from_properties(&spec.to_properties()).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(back, spec);
    }

    #[test]
    fn separators_comments_and_continuations_follow_java_properties() {
        let text = "! bang comment\n  # hash comment\nrecordcount : 42\nfieldcount = 2\n\
                    fieldlength=\\\n   7\nrequestdistribution uniform\n";
        let (spec, w) = WorkloadSpec::from_properties(text).unwrap();
        assert!(w.is_empty());
        assert_eq!(
            (spec.record_count, spec.field_count, spec.field_length),
            (42, 2, 7)
        );
    }

    #[test]
    fn unknown_keys_are_returned_as_warnings_with_lines() {
        let text = "recordcount=10\nhotspotdatafraction=0.2\nreadallfields=false\nfoo=bar\n";
        let (_, w) = WorkloadSpec::from_properties(text).unwrap();
        let keys: Vec<_> = w.iter().map(|w| (w.line, w.key.as_str())).collect();
        assert_eq!(keys, [(2, "hotspotdatafraction"), (4, "foo")]);
        assert!(w[1].to_string().contains("line 4"));
    }

    #[test]
    fn bad_numbers_name_the_key_and_line() {
        let err = WorkloadSpec::from_properties("recordcount=10\nfieldlength=ten\n").unwrap_err();
        match &err {
            YcsbError::BadValue {
                key, line, value, ..
            } => {
                assert_eq!(
                    (key.as_str(), *line, value.as_str()),
                    ("fieldlength", 2, "ten")
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("fieldlength") && msg.contains("line 2"),
            "{msg}"
        );
        for text in [
            "readproportion=abc",
            "readproportion=NaN",
            "recordcount=-5",
            "requestdistribution=hotspot",
            "scanlengthdistribution=constant",
            "workload=site.ycsb.workloads.RestWorkload",
        ] {
            assert!(
                matches!(
                    WorkloadSpec::from_properties(text),
                    Err(YcsbError::BadValue { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn inconsistent_values_are_rejected() {
        for (text, key) in [
            ("recordcount=0", "recordcount"),
            ("readproportion=0\nupdateproportion=0", "readproportion"),
            ("readproportion=-1", "readproportion"),
            ("zipfianconstant=1", "zipfianconstant"),
            (
                "recordcount=10\ninsertstart=5\ninsertcount=6",
                "insertcount",
            ),
            ("minscanlength=5\nmaxscanlength=4", "minscanlength"),
            ("fieldcount=100000\nfieldlength=100000", "fieldlength"),
        ] {
            match WorkloadSpec::from_properties(text) {
                Err(YcsbError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            WorkloadSpec::from_properties("justakey\n"),
            Err(YcsbError::Syntax { line: 1, .. })
        ));
    }

    #[test]
    fn from_file_reports_missing_files() {
        let err = WorkloadSpec::from_file("/nonexistent/dmkit/workloadz").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/dmkit/workloadz"));
    }
}
