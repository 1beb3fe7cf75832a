//! Document conversion of uploads (#31) against the real binaries: `antler-sandbox` with the converter
//! under bwrap, and `antler serve sandbox` with it as a plain child process (the `antler` executable
//! starting itself as the converter). Every document is made here: a PDF written by hand (a Flate
//! content stream, a cross-reference table), an encrypted copy made by lopdf (RC4, user password), DOCX,
//! PPTX and XLSX as zip containers of their XML parts, an HTML page. The hostile files — an encrypted
//! PDF, a zip bomb under a .docx name, a 200 MB file — each fail cleanly within the timeout, the file
//! still stored, and the service converts the next document as before.

use std::io::Write;
use std::time::{Duration, Instant};

use antler_integration_tests::{Launch, Process, start};
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::*;
use tonic::Request;
use tonic::transport::Channel;

const KEY: &str = "convert-test-key-0123456789";
const THREAD: &str = "convert-thread";
const CHUNK: usize = 64 * 1024;

fn config(convert: &str, uploads: &str) -> String {
    format!(
        "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: {KEY}\n        user: alice\nsandbox:\n  provider: local\n  uploads:\n{uploads}    convert:\n{convert}"
    )
}

fn authed<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Ok(value) = format!("Bearer {KEY}").parse() {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn client(process: &Process) -> anyhow::Result<SandboxServiceClient<Channel>> {
    let mut client = SandboxServiceClient::new(process.channel().await?);
    client.acquire_sandbox(authed(AcquireSandboxRequest { thread_id: THREAD.to_owned() })).await?;
    Ok(client)
}

/// Uploads `files` (name, bytes) with convert_documents and returns the reply.
async fn upload(client: &mut SandboxServiceClient<Channel>, files: &[(&str, &[u8])]) -> anyhow::Result<UploadFilesResponse> {
    let header = UploadHeader {
        thread_id: THREAD.to_owned(),
        files: files
            .iter()
            .map(|(name, bytes)| UploadFileSpec { filename: (*name).to_owned(), size_bytes: bytes.len() as u64, ..Default::default() })
            .collect(),
        convert_documents: true,
    };
    let mut messages = vec![UploadFilesRequest { payload: Some(upload_files_request::Payload::Header(header)) }];
    for (i, (_, bytes)) in files.iter().enumerate() {
        for chunk in bytes.chunks(CHUNK) {
            messages.push(UploadFilesRequest {
                payload: Some(upload_files_request::Payload::Chunk(UploadChunk { file_index: i as u32, data: chunk.to_vec() })),
            });
        }
    }
    Ok(client.upload_files(authed(tokio_stream::iter(messages))).await?.into_inner())
}

async fn read(client: &mut SandboxServiceClient<Channel>, path: &str) -> anyhow::Result<String> {
    let request = ReadFileRequest { thread_id: THREAD.to_owned(), path: path.to_owned(), ..Default::default() };
    Ok(client.read_file(authed(request)).await?.into_inner().content)
}

// ---------------------------------------------------------------------------------------------
// Documents

/// A PDF with `lines` of text on one page (Helvetica, WinAnsi), its content stream Flate-compressed.
fn pdf(lines: &[&str]) -> Vec<u8> {
    let mut content = String::from("BT /F1 12 Tf 72 720 Td 14 TL\n");
    for line in lines {
        content.push_str(&format!("({}) Tj T*\n", line.replace('\\', "\\\\").replace('(', "\\(").replace(')', "\\)")));
    }
    content.push_str("ET\n");
    let mut deflate = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    deflate.write_all(content.as_bytes()).expect("compressing in memory cannot fail");
    let stream = deflate.finish().expect("compressing in memory cannot fail");
    let mut objects: Vec<Vec<u8>> = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".to_vec(),
    ];
    let mut content_object = format!("<< /Length {} /Filter /FlateDecode >>\nstream\n", stream.len()).into_bytes();
    content_object.extend_from_slice(&stream);
    content_object.extend_from_slice(b"\nendstream");
    objects.push(content_object);
    objects.push(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_vec());
    let mut out = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    // A file identifier: the standard security handler derives its key from it.
    let id = "<7a3f5e9c1b2d4e6f8091a2b3c4d5e6f7>";
    out.extend_from_slice(
        format!("trailer\n<< /Size {} /Root 1 0 R /ID [{id} {id}] >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes(),
    );
    out
}

/// The same PDF encrypted by lopdf (RC4 128-bit, the standard security handler) with a user password:
/// no reader shows its text without "secret".
fn encrypted_pdf(lines: &[&str]) -> anyhow::Result<Vec<u8>> {
    let mut document = lopdf::Document::load_mem(&pdf(lines))?;
    let version = lopdf::EncryptionVersion::V2 {
        document: &document,
        owner_password: "owner",
        user_password: "secret",
        key_length: 128,
        permissions: lopdf::Permissions::default(),
    };
    let state = lopdf::EncryptionState::try_from(version)?;
    document.encrypt(&state)?;
    let mut out = Vec::new();
    document.save_to(&mut out)?;
    Ok(out)
}

fn zip(parts: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, body) in parts {
        writer.start_file(*name, options).expect("in-memory zip");
        writer.write_all(body.as_bytes()).expect("in-memory zip");
    }
    writer.finish().expect("in-memory zip").into_inner()
}

const W: &str = r#"xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main""#;
const RELS_NS: &str = r#"xmlns="http://schemas.openxmlformats.org/package/2006/relationships""#;
const OFFICE_DOC: &str = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument";

fn docx(heading: &str, paragraph: &str, table: &[[&str; 2]]) -> Vec<u8> {
    let run = |t: &str| format!(r#"<w:r><w:t xml:space="preserve">{t}</w:t></w:r>"#);
    let rows: String =
        table.iter().map(|[a, b]| format!("<w:tr><w:tc><w:p>{}</w:p></w:tc><w:tc><w:p>{}</w:p></w:tc></w:tr>", run(a), run(b))).collect();
    let document = format!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<w:document {W}><w:body>
<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr>{}</w:p>
<w:p>{}</w:p>
<w:tbl>{rows}</w:tbl>
<w:sectPr/></w:body></w:document>"#,
        run(heading),
        run(paragraph)
    );
    zip(&[
        (
            "[Content_Types].xml",
            r#"<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#,
        ),
        (
            "_rels/.rels",
            &format!(
                r#"<Relationships {RELS_NS}><Relationship Id="rId1" Type="{OFFICE_DOC}" Target="word/document.xml"/></Relationships>"#
            ),
        ),
        ("word/document.xml", &document),
    ])
}

fn pptx(slides: &[(&str, &str)]) -> Vec<u8> {
    let ns = r#"xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships" xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main""#;
    let shape = |kind: &str, text: &str| {
        format!(
            r#"<p:sp><p:nvSpPr><p:cNvPr id="2" name="s"/><p:cNvSpPr/><p:nvPr>{kind}</p:nvPr></p:nvSpPr><p:spPr/><p:txBody><a:bodyPr/><a:p><a:r><a:rPr lang="en-US"/><a:t>{text}</a:t></a:r></a:p></p:txBody></p:sp>"#
        )
    };
    let mut parts: Vec<(String, String)> = Vec::new();
    let mut ids = String::new();
    let mut rels = String::new();
    let mut overrides = String::new();
    for (i, (title, body)) in slides.iter().enumerate() {
        let n = i + 1;
        ids.push_str(&format!(r#"<p:sldId id="{}" r:id="rId{n}"/>"#, 255 + n));
        rels.push_str(&format!(
            r#"<Relationship Id="rId{n}" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/slide" Target="slides/slide{n}.xml"/>"#
        ));
        overrides.push_str(&format!(
            r#"<Override PartName="/ppt/slides/slide{n}.xml" ContentType="application/vnd.openxmlformats-officedocument.presentationml.slide+xml"/>"#
        ));
        parts.push((
            format!("ppt/slides/slide{n}.xml"),
            format!(
                r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:sld {ns}><p:cSld><p:spTree><p:nvGrpSpPr><p:cNvPr id="1" name=""/><p:cNvGrpSpPr/><p:nvPr/></p:nvGrpSpPr><p:grpSpPr/>{}{}</p:spTree></p:cSld></p:sld>"#,
                shape(r#"<p:ph type="title"/>"#, title),
                shape(r#"<p:ph idx="1"/>"#, body)
            ),
        ));
    }
    parts.push((
        "ppt/presentation.xml".to_owned(),
        format!(r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><p:presentation {ns}><p:sldIdLst>{ids}</p:sldIdLst><p:sldSz cx="9144000" cy="6858000"/><p:notesSz cx="6858000" cy="9144000"/></p:presentation>"#),
    ));
    parts.push(("ppt/_rels/presentation.xml.rels".to_owned(), format!("<Relationships {RELS_NS}>{rels}</Relationships>")));
    parts.push((
        "_rels/.rels".to_owned(),
        format!(r#"<Relationships {RELS_NS}><Relationship Id="rId1" Type="{OFFICE_DOC}" Target="ppt/presentation.xml"/></Relationships>"#),
    ));
    parts.push((
        "[Content_Types].xml".to_owned(),
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/ppt/presentation.xml" ContentType="application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"/>{overrides}</Types>"#
        ),
    ));
    let refs: Vec<(&str, &str)> = parts.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    zip(&refs)
}

fn xlsx(sheet: &str, rows: &[[&str; 2]]) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut data = String::new();
    for (r, row) in rows.iter().enumerate() {
        data.push_str(&format!(r#"<row r="{}">"#, r + 1));
        for (c, value) in row.iter().enumerate() {
            let reference = format!("{}{}", (b'A' + c as u8) as char, r + 1);
            if value.parse::<f64>().is_ok() {
                data.push_str(&format!(r#"<c r="{reference}"><v>{value}</v></c>"#));
            } else {
                data.push_str(&format!(r#"<c r="{reference}" t="s"><v>{}</v></c>"#, strings.len()));
                strings.push(format!("<si><t>{value}</t></si>"));
            }
        }
        data.push_str("</row>");
    }
    let main = r#"xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main""#;
    zip(&[
        (
            "[Content_Types].xml",
            r#"<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/><Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>"#,
        ),
        (
            "_rels/.rels",
            &format!(r#"<Relationships {RELS_NS}><Relationship Id="rId1" Type="{OFFICE_DOC}" Target="xl/workbook.xml"/></Relationships>"#),
        ),
        (
            "xl/workbook.xml",
            &format!(
                r#"<?xml version="1.0" encoding="UTF-8"?><workbook {main} xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="{sheet}" sheetId="1" r:id="rId1"/></sheets></workbook>"#
            ),
        ),
        (
            "xl/_rels/workbook.xml.rels",
            &format!(
                r#"<Relationships {RELS_NS}><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/><Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/></Relationships>"#
            ),
        ),
        (
            "xl/worksheets/sheet1.xml",
            &format!(r#"<?xml version="1.0" encoding="UTF-8"?><worksheet {main}><sheetData>{data}</sheetData></worksheet>"#),
        ),
        (
            "xl/sharedStrings.xml",
            &format!(
                r#"<?xml version="1.0" encoding="UTF-8"?><sst {main} count="{0}" uniqueCount="{0}">{1}</sst>"#,
                strings.len(),
                strings.concat()
            ),
        ),
    ])
}

/// A zip bomb under a .docx name: `word/document.xml` is a real deflate stream that inflates to
/// `inflated_mib` MiB of zeros (one sync-flushed block of 1 MiB, repeated), its header declaring only
/// `declared` bytes — so the size check of the central directory passes and only counting the bytes
/// really inflated catches it. (A CRC of 0: no reader gets to the end to compare it.)
fn zip_bomb(declared: u32, inflated_mib: usize) -> Vec<u8> {
    let mut compress = flate2::Compress::new(flate2::Compression::best(), false);
    let zeros = vec![0u8; 1 << 20];
    let mut block = Vec::with_capacity(1 << 16);
    compress.compress_vec(&zeros, &mut block, flate2::FlushCompress::Sync).expect("deflating in memory cannot fail");
    let mut data = Vec::with_capacity(block.len() * inflated_mib + 8);
    for _ in 0..inflated_mib {
        data.extend_from_slice(&block);
    }
    // A final empty stored block ends the stream.
    data.extend_from_slice(&[0x01, 0x00, 0x00, 0xFF, 0xFF]);
    let entries: [(&str, Vec<u8>, u16, u32); 2] = [
        (
            "[Content_Types].xml",
            br#"<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>"#.to_vec(),
            0,
            0,
        ),
        ("word/document.xml", data, 8, declared),
    ];
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, body, method, declared_size) in &entries {
        let offset = out.len() as u32;
        let uncompressed = if *method == 0 { body.len() as u32 } else { *declared_size };
        let crc = if *method == 0 { crc32fast_hash(body) } else { 0 };
        let mut header = Vec::new();
        header.extend_from_slice(&20u16.to_le_bytes()); // version needed
        header.extend_from_slice(&0u16.to_le_bytes()); // flags
        header.extend_from_slice(&method.to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes()); // time
        header.extend_from_slice(&0x21u16.to_le_bytes()); // date: 1980-01-01
        header.extend_from_slice(&crc.to_le_bytes());
        header.extend_from_slice(&(body.len() as u32).to_le_bytes());
        header.extend_from_slice(&uncompressed.to_le_bytes());
        header.extend_from_slice(&(name.len() as u16).to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes()); // extra
        out.extend_from_slice(&0x04034b50u32.to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(body);
        central.extend_from_slice(&0x02014b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        central.extend_from_slice(&header);
        central.extend_from_slice(&[0u8; 6]); // comment length, disk, internal attributes
        central.extend_from_slice(&0u32.to_le_bytes()); // external attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x06054b50u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // disk numbers
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // comment length
    out
}

fn crc32fast_hash(bytes: &[u8]) -> u32 {
    let mut hasher = flate2::Crc::new();
    hasher.update(bytes);
    hasher.sum()
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The good documents convert, each to Markdown that holds its text, beside the original.
async fn good_documents_convert(client: &mut SandboxServiceClient<Channel>) -> anyhow::Result<()> {
    let docs: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "report.pdf",
            pdf(&["Antler conversion test", "Quarterly revenue grew by 12 percent"]),
            &["## Page 1", "Antler conversion test", "Quarterly revenue grew by 12 percent"],
        ),
        (
            "memo.docx",
            docx("Research memo", "The agent reads uploads as Markdown.", &[["Region", "Sales"], ["North", "42"]]),
            &["# Research memo", "The agent reads uploads as Markdown.", "| Region | Sales |", "| North | 42 |"],
        ),
        (
            "deck.pptx",
            pptx(&[("Roadmap", "Ship conversion"), ("Risks", "Zip bombs")]),
            &["## Slide 1", "### Roadmap", "Ship conversion", "## Slide 2", "Zip bombs"],
        ),
        ("budget.xlsx", xlsx("Budget", &[["Item", "Cost"], ["Rent", "1200.5"]]), &["## Budget", "| Item | Cost |", "| Rent | 1200.5 |"]),
        (
            "page.html",
            b"<html><head><title>x</title></head><body><h2>Findings</h2><p>HTML <b>too</b>.</p></body></html>".to_vec(),
            &["## Findings", "HTML **too**."],
        ),
    ];
    let files: Vec<(&str, &[u8])> = docs.iter().map(|(n, b, _)| (*n, b.as_slice())).collect();
    let started = Instant::now();
    let reply = upload(client, &files).await?;
    let elapsed = started.elapsed();
    println!("uploaded and converted {} documents in {elapsed:?}", docs.len());
    assert_eq!(reply.files.len(), docs.len(), "{reply:?}");
    for ((name, _, expected), stored) in docs.iter().zip(&reply.files) {
        assert!(stored.conversion_error.is_empty(), "{name}: {}", stored.conversion_error);
        let markdown = stored.markdown.clone().unwrap_or_default();
        let stem = name.rsplit_once('.').map_or(*name, |(s, _)| s);
        assert_eq!(markdown.virtual_path, format!("/mnt/user-data/uploads/{stem}.md"), "{name}");
        let text = read(client, &markdown.virtual_path).await?;
        assert_eq!(markdown.size_bytes, text.len() as u64, "{name}");
        for line in *expected {
            assert!(text.contains(line), "{name}: {line:?} missing from\n{text}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_convert_under_bwrap_and_hostile_files_fail_cleanly() -> anyhow::Result<()> {
    let timeout_secs = 20;
    let sandbox = start(
        "antler-sandbox",
        Launch::default().config(config(
            &format!("      isolation: bwrap\n      timeout_secs: {timeout_secs}\n"),
            "    max_file_bytes: 268435456\n    max_total_bytes: 268435456\n",
        )),
    )?;
    let mut client = client(&sandbox).await?;
    good_documents_convert(&mut client).await.map_err(|e| anyhow::anyhow!("{e}\n{}", sandbox.stderr()))?;
    assert!(sandbox.stderr().contains("document conversion ready") && sandbox.stderr().contains("bwrap"), "{}", sandbox.stderr());

    // Hostile files: each stored, each without Markdown and with a reason, none near the timeout.
    let encrypted = encrypted_pdf(&["Secret plans"])?;
    let lying_bomb = zip_bomb(4096, 1024);
    let honest_bomb = zip_bomb(1 << 30, 64);
    let legacy = b"\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1 an old Word file".to_vec();
    let broken = pdf(&["truncated"])[..120].to_vec();
    let cases: [(&str, &[u8], &str); 5] = [
        ("secret.pdf", &encrypted, "encrypted"),
        ("bomb.docx", &lying_bomb, "max_inflated_part_bytes"),
        ("declared-bomb.docx", &honest_bomb, "max_inflated_total_bytes"),
        ("old.doc", &legacy, ".doc"),
        ("broken.pdf", &broken, "not a valid PDF"),
    ];
    for (name, bytes, why) in cases {
        let started = Instant::now();
        let reply = upload(&mut client, &[(name, bytes)]).await?;
        let elapsed = started.elapsed();
        let stored = reply.files.first().cloned().unwrap_or_default();
        assert_eq!(stored.size_bytes, bytes.len() as u64, "{name}: the original is stored whole");
        assert!(stored.markdown.is_none(), "{name}: {stored:?}");
        assert!(stored.conversion_error.contains(why), "{name}: expected {why:?} in {:?}", stored.conversion_error);
        assert!(elapsed < Duration::from_secs(timeout_secs / 3), "{name} took {elapsed:?}, near the {timeout_secs} s timeout");
        println!("{name}: {elapsed:?}: {}", stored.conversion_error);
    }

    // 200 MB: above max_input_bytes (50 MiB by default) it is stored and refused before any parsing.
    let mut big = pdf(&["big"]);
    big.resize(200 * 1000 * 1000, b' ');
    let started = Instant::now();
    let reply = upload(&mut client, &[("big.pdf", &big)]).await?;
    let stored = reply.files.first().cloned().unwrap_or_default();
    assert_eq!(stored.size_bytes, big.len() as u64);
    assert!(stored.conversion_error.contains("max_input_bytes"), "{:?}", stored.conversion_error);
    println!("big.pdf (200 MB) uploaded and refused in {:?}: {}", started.elapsed(), stored.conversion_error);

    // Still healthy: the next documents convert as before, and a health check answers SERVING.
    let health = antler_integration_tests::health(sandbox.channel().await?, "antler.sandbox.v1.SandboxService").await?;
    assert_eq!(health, tonic_health::pb::health_check_response::ServingStatus::Serving);
    let reply = upload(&mut client, &[("after.docx", &docx("Still here", "Converted after the bombs.", &[["a", "b"]]))]).await?;
    let markdown = reply.files.first().and_then(|f| f.markdown.clone()).unwrap_or_default();
    assert!(read(&mut client, &markdown.virtual_path).await?.contains("Converted after the bombs."), "{reply:?}\n{}", sandbox.stderr());
    Ok(())
}

/// A one-page PDF whose uncompressed content stream is about `size` bytes of text operators.
fn long_pdf(size: usize) -> Vec<u8> {
    let line = b"(All work and no play makes a long document) Tj T*\n";
    let mut content = Vec::with_capacity(size + 64);
    content.extend_from_slice(b"BT /F1 12 Tf 72 720 Td 14 TL\n");
    while content.len() < size {
        content.extend_from_slice(line);
    }
    content.extend_from_slice(b"ET\n");
    let mut big = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    let head: [&[u8]; 3] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
    ];
    for (i, body) in head.iter().enumerate() {
        offsets.push(big.len());
        big.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        big.extend_from_slice(body);
        big.extend_from_slice(b"\nendobj\n");
    }
    offsets.push(big.len());
    big.extend_from_slice(format!("4 0 obj\n<< /Length {} >>\nstream\n", content.len()).as_bytes());
    big.extend_from_slice(&content);
    big.extend_from_slice(b"\nendstream\nendobj\n");
    offsets.push(big.len());
    big.extend_from_slice(b"5 0 obj\n<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>\nendobj\n");
    let xref = big.len();
    big.extend_from_slice(b"xref\n0 6\n0000000000 65535 f \n");
    for offset in offsets {
        big.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    big.extend_from_slice(format!("trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n").as_bytes());
    big
}

/// Converter processes (the marker on their command line) whose parent is `pid` or one of its children.
fn converters_of(pid: u32) -> Vec<u32> {
    let parent_of = |p: &str| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(id) = name.parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains("__antler-convert-document") {
            continue;
        }
        let parent = parent_of(&name);
        let grandparent = parent.and_then(|p| parent_of(&p.to_string()));
        if parent == Some(pid) || grandparent == Some(pid) {
            found.push(id);
        }
    }
    found
}

/// A conversion that outlives `timeout_secs` is killed — its process gone when the reply comes — and the
/// reply says so; the next conversion works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_past_its_timeout_is_killed() -> anyhow::Result<()> {
    let sandbox = start(
        "antler-sandbox",
        Launch::default().config(config("      isolation: process\n      timeout_secs: 1\n      max_memory_bytes: 4294967296\n", "")),
    )?;
    let mut client = client(&sandbox).await?;
    // 45 MB of text operators: several seconds of parsing in any build, far more than 1 s.
    let slow = long_pdf(45 * 1000 * 1000);
    let reply = upload(&mut client, &[("slow.pdf", &slow)]).await?;
    let stored = reply.files.first().cloned().unwrap_or_default();
    println!("slow.pdf: {:?}", stored.conversion_error);
    assert!(stored.conversion_error.contains("did not finish within 1 s (sandbox.uploads.convert.timeout_secs)"), "{stored:?}");
    assert_eq!(converters_of(sandbox.pid()), Vec::<u32>::new(), "the timed-out converter is gone");
    let reply = upload(&mut client, &[("quick.pdf", &pdf(&["Quick one"]))]).await?;
    let markdown = reply.files.first().and_then(|f| f.markdown.clone()).unwrap_or_default();
    assert!(read(&mut client, &markdown.virtual_path).await?.contains("Quick one"), "{reply:?}\n{}", sandbox.stderr());
    Ok(())
}

/// A 200 MB PDF the converter is allowed to read: it runs into the memory limit or the timeout, is
/// killed, and the reply says which — well before a client would give up — and the service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_document_that_must_be_parsed_is_stopped_by_the_limits() -> anyhow::Result<()> {
    let timeout_secs = 15;
    let sandbox = start(
        "antler-sandbox",
        Launch::default().config(config(
            &format!("      isolation: process\n      timeout_secs: {timeout_secs}\n      max_input_bytes: 268435456\n      max_memory_bytes: 536870912\n      max_inflated_part_bytes: 268435456\n      max_inflated_total_bytes: 268435456\n"),
            "    max_file_bytes: 268435456\n    max_total_bytes: 268435456\n",
        )),
    )?;
    let mut client = client(&sandbox).await?;
    let big = long_pdf(200 * 1000 * 1000);

    let started = Instant::now();
    let reply = upload(&mut client, &[("huge.pdf", &big)]).await?;
    let elapsed = started.elapsed();
    let stored = reply.files.first().cloned().unwrap_or_default();
    println!(
        "huge.pdf ({} bytes): {elapsed:?}: markdown {:?} error {:?}",
        big.len(),
        stored.markdown.as_ref().map(|m| m.size_bytes),
        stored.conversion_error
    );
    assert_eq!(stored.size_bytes, big.len() as u64);
    // Either limit may be the one that stops it; the reply names it.
    let limited =
        ["sandbox.uploads.convert.max_memory_bytes", "sandbox.uploads.convert.timeout_secs", "sandbox.uploads.convert.max_output_bytes"];
    match &stored.markdown {
        // Converted within the limits: then its Markdown was cut at max_output_bytes.
        Some(markdown) => {
            let text_head = read(&mut client, &markdown.virtual_path).await?;
            assert!(text_head.contains("All work and no play"), "{}", &text_head[..text_head.len().min(200)]);
        }
        None => assert!(limited.iter().any(|l| stored.conversion_error.contains(l)), "{:?}", stored.conversion_error),
    }
    // The upload's own time: streaming 200 MB, then at most the timeout.
    assert!(elapsed < Duration::from_secs(timeout_secs + 90), "{elapsed:?}");

    let reply = upload(&mut client, &[("next.pdf", &pdf(&["Next document"]))]).await?;
    let markdown = reply.files.first().and_then(|f| f.markdown.clone()).unwrap_or_default();
    assert!(read(&mut client, &markdown.virtual_path).await?.contains("Next document"), "{reply:?}\n{}", sandbox.stderr());
    Ok(())
}

/// `antler serve sandbox` starts itself as the converter (the hook in `antler`'s main), as a plain
/// child process here; ConvertDocument converts a file the agent wrote into its workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn antler_converts_as_its_own_child_and_convert_document_serves_workspace_files() -> anyhow::Result<()> {
    let antler = start("antler", Launch::new(["serve", "sandbox"]).config(config("      isolation: process\n", "")))?;
    let mut client = client(&antler).await?;
    good_documents_convert(&mut client).await.map_err(|e| anyhow::anyhow!("{e}\n{}", antler.stderr()))?;

    let html = "<html><body><h1>Fetched paper</h1><p>Web pages convert too.</p></body></html>";
    let write = WriteFileRequest {
        thread_id: THREAD.to_owned(),
        path: "web/paper.html".to_owned(),
        content: Some(write_file_request::Content::Text(html.to_owned())),
        ..Default::default()
    };
    client.write_file(authed(write)).await?;
    let reply = client
        .convert_document(authed(ConvertDocumentRequest { thread_id: THREAD.to_owned(), path: "web/paper.html".to_owned() }))
        .await?
        .into_inner();
    let markdown = reply.markdown.unwrap_or_default();
    assert_eq!((reply.format.as_str(), markdown.virtual_path.as_str()), ("html", "/mnt/user-data/workspace/web/paper.md"));
    assert!(read(&mut client, &markdown.virtual_path).await?.contains("# Fetched paper"));

    let bad = client
        .convert_document(authed(ConvertDocumentRequest {
            thread_id: THREAD.to_owned(),
            path: "/mnt/user-data/uploads/memo.md".to_owned(),
        }))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert!(matches!(&bad, Some((tonic::Code::InvalidArgument, m)) if m.contains("not a document")), "{bad:?}");
    let secret = encrypted_pdf(&["Secret"])?;
    upload(&mut client, &[("locked.pdf", &secret)]).await?;
    let locked = client
        .convert_document(authed(ConvertDocumentRequest {
            thread_id: THREAD.to_owned(),
            path: "/mnt/user-data/uploads/locked.pdf".to_owned(),
        }))
        .await
        .err()
        .map(|s| (s.code(), s.message().to_owned()));
    assert!(matches!(&locked, Some((tonic::Code::FailedPrecondition, m)) if m.contains("encrypted")), "{locked:?}");
    Ok(())
}

/// In `antler up`, a PDF uploaded with the message is converted, and the model is told where its
/// Markdown is — the path the UploadFiles reply named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_is_told_the_markdown_path_of_a_converted_upload() -> anyhow::Result<()> {
    use antler_integration_tests::db::{Backend, TestDb};
    use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn};
    use antler_integration_tests::runs::{ALICE, authed as as_user, clients, run_to_end, start_agent_up, user_text};
    use antler_proto::common::{ContentPart, FilePart, content_part};
    use antler_proto::runs::{CreateRunRequest, CreateThreadRequest, RunStatus};

    let double = LlmDouble::start(vec![Turn::text("I read the report.")], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let thread = threads
        .create_thread(as_user(CreateThreadRequest { thread_id: "convert-agent".to_owned(), ..Default::default() }, ALICE))
        .await?
        .into_inner()
        .thread
        .unwrap_or_default();
    let mut sandbox = SandboxServiceClient::new(server.channel().await?);
    sandbox.acquire_sandbox(as_user(AcquireSandboxRequest { thread_id: thread.thread_id.clone() }, ALICE)).await?;
    let report = pdf(&["Findings for the agent"]);
    let header = UploadHeader {
        thread_id: thread.thread_id.clone(),
        files: vec![UploadFileSpec { filename: "report.pdf".to_owned(), size_bytes: report.len() as u64, ..Default::default() }],
        convert_documents: true,
    };
    let stream = tokio_stream::iter(vec![
        UploadFilesRequest { payload: Some(upload_files_request::Payload::Header(header)) },
        UploadFilesRequest { payload: Some(upload_files_request::Payload::Chunk(UploadChunk { file_index: 0, data: report.clone() })) },
    ]);
    let uploaded = sandbox.upload_files(as_user(stream, ALICE)).await?.into_inner();
    let stored = uploaded.files.first().cloned().unwrap_or_default();
    let markdown = stored.markdown.clone().unwrap_or_default();
    assert_eq!(markdown.virtual_path, "/mnt/user-data/uploads/report.md", "{stored:?}\n{}", server.stderr());

    let mut message = user_text("Summarise the report");
    message.content.push(ContentPart {
        part: Some(content_part::Part::File(FilePart {
            path: stored.virtual_path.clone(),
            name: "report.pdf".to_owned(),
            size_bytes: report.len() as u64,
            ..Default::default()
        })),
    });
    let request = CreateRunRequest { thread_id: thread.thread_id.clone(), input: vec![message], ..Default::default() };
    let run = run_to_end(&mut runs, request, Duration::from_secs(60)).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let seen = double.requests()[0]["messages"].to_string();
    assert!(seen.contains("Path: /mnt/user-data/uploads/report.pdf"), "{seen}");
    assert!(seen.contains("Markdown: /mnt/user-data/uploads/report.md"), "{seen}");
    Ok(())
}
