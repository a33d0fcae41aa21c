"""Content blocks as run input, stored once (docs/inputs-and-outputs.md).

Revision ID: 0016_content_blobs
Revises: 0015_run_params

- A run's input may be `{"content": [blocks]}` (with or without `"text"`):
  `hango_run_input` (0015's, renamed `hango_run_input_text`, still checks `text` and
  `config`) is wrapped by a new `hango_run_input` that accepts `content` and checks it
  with `hango_check_content`: the limits the API documents, SQLSTATE QH003, one line
  naming the block by index, nothing queued.
- blobs (tenant, sha256 → media type, size, bytes) and run_blobs (run → blob): a base64
  source of at least 16384 characters is stored once; the run's input (and so its
  history) holds `source.hango_blob` (the sha256, hex) and `source.size` instead of the
  data. Two triggers on runs do it for every insert that carries content: BEFORE INSERT
  moves the bytes into blobs (ON CONFLICT DO NOTHING: the same bytes twice are stored
  once), AFTER INSERT records the run's references (so an idempotent enqueue that
  inserted no run adds no reference). run_blobs rows go with their run (ON DELETE
  CASCADE); store/gc.py deletes the blobs no run refers to any more.
- blobs.data is STORAGE EXTERNAL: images and PDFs are compressed already.

Additive: new tables, triggers that act only on inputs with `content` (which code at
0012 never writes), a wrapper that answers a text input exactly as before. Downgrading
drops them and restores 0015's hango_run_input.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0016_content_blobs"
down_revision = "0015_run_params"
branch_labels = None
depends_on = None
serves_code_since = "0012_names_and_trees"

BLOB_MIN_CHARS = 16384  # provider/content.py BLOB_MIN_CHARS
# The API's documented limits (docs/inputs-and-outputs.md, "Limits"); the media types are
# the SDK's (tests/test_content_input.py holds them to it).
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_B64 = 5 * 1024 * 1024  # 5 MB of base64 per image
MAX_PDF_PAGES = 100
MAX_REQUEST = 32 * 1024 * 1024  # 32 MB, the Messages API's request size limit
MAX_IMAGES = 100  # images per request

SNIFF = r"""
CREATE FUNCTION hango_sniff(b bytea) RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN substring(b FROM 1 FOR 8) = '\x89504e470d0a1a0a'::bytea THEN 'image/png'
        WHEN substring(b FROM 1 FOR 3) = '\xffd8ff'::bytea THEN 'image/jpeg'
        WHEN substring(b FROM 1 FOR 6) IN ('GIF87a'::bytea, 'GIF89a'::bytea) THEN 'image/gif'
        WHEN substring(b FROM 1 FOR 4) = 'RIFF'::bytea
            AND substring(b FROM 9 FOR 4) = 'WEBP'::bytea THEN 'image/webp'
        WHEN substring(b FROM 1 FOR 5) = '%PDF-'::bytea THEN 'application/pdf'
    END
$fn$
"""

# Page objects (`/Type /Page`, not `/Pages`) in the file's uncompressed text: a PDF whose
# page objects sit in compressed object streams counts 0 here and is left to the API.
PDF_PAGES = r"""
CREATE FUNCTION hango_pdf_pages(b bytea) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE t text := encode(b, 'escape'); n int := 0; p text;
BEGIN
    FOREACH p IN ARRAY ARRAY['/Type /Page', '/Type/Page'] LOOP
        n := n + (length(t) - length(replace(t, p, ''))) / length(p)
              - (length(t) - length(replace(t, p || 's', ''))) / length(p || 's');
    END LOOP;
    RETURN n;
END $fn$
"""

CHECK_CONTENT = f"""
CREATE FUNCTION hango_check_content(content jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    b jsonb; i int := -1; kind text; src jsonb; mt text; d text; bytes bytea; n int;
    images int := 0; at text;
BEGIN
    IF jsonb_typeof(content) IS DISTINCT FROM 'array' OR jsonb_array_length(content) = 0 THEN
        RAISE EXCEPTION 'input.content must be a non-empty array of content blocks'
            USING ERRCODE = 'QH003';
    END IF;
    IF octet_length(content::text) > {MAX_REQUEST} THEN
        RAISE EXCEPTION 'input.content is % bytes; a request to the API may be at most 32 MB (%)',
            octet_length(content::text), {MAX_REQUEST} USING ERRCODE = 'QH003';
    END IF;
    FOR b IN SELECT e.value FROM jsonb_array_elements(content) WITH ORDINALITY e ORDER BY e.ordinality
    LOOP
        i := i + 1;
        IF jsonb_typeof(b) <> 'object' OR jsonb_typeof(b->'type') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'input.content[%]: a content block is an object with a string "type"', i
                USING ERRCODE = 'QH003';
        END IF;
        kind := b->>'type';
        at := format('input.content[%s] (%s)', i, kind);
        IF kind ~ '(tool_use|tool_result)$' OR kind ~ 'thinking' THEN
            RAISE EXCEPTION '%: not a block a run''s input may hold (it belongs to a turn''s calls)',
                at USING ERRCODE = 'QH003';
        END IF;
        IF kind = 'image' THEN
            images := images + 1;
        END IF;
        src := b->'source';
        CONTINUE WHEN jsonb_typeof(src) IS DISTINCT FROM 'object';
        IF src ? 'hango_blob' THEN
            RAISE EXCEPTION '%: source.hango_blob is reserved for stored blocks', at
                USING ERRCODE = 'QH003';
        END IF;
        CONTINUE WHEN src->>'type' IS DISTINCT FROM 'base64';
        mt := src->>'media_type';
        d := src->>'data';
        IF kind = 'image' AND (mt IS NULL OR mt <> ALL (ARRAY{list(IMAGE_TYPES)})) THEN
            RAISE EXCEPTION '%: media type % is not one the API takes for an image ({", ".join(IMAGE_TYPES)})',
                at, coalesce(quote_literal(mt), 'NULL') USING ERRCODE = 'QH003';
        ELSIF kind = 'document' AND mt IS DISTINCT FROM 'application/pdf' THEN
            RAISE EXCEPTION '%: media type % is not one the API takes for a base64 document (application/pdf)',
                at, coalesce(quote_literal(mt), 'NULL') USING ERRCODE = 'QH003';
        END IF;
        IF jsonb_typeof(src->'data') IS DISTINCT FROM 'string' OR d = ''
                OR length(d) % 4 <> 0 OR d !~ '^[A-Za-z0-9+/]*={{0,2}}$' THEN
            RAISE EXCEPTION '%: source.data is not valid base64 (standard alphabet, padded, no spaces)',
                at USING ERRCODE = 'QH003';
        END IF;
        IF kind = 'image' AND length(d) > {MAX_IMAGE_B64} THEN
            RAISE EXCEPTION '%: the image is % characters of base64; the API takes at most 5 MB (%) per image',
                at, length(d), {MAX_IMAGE_B64} USING ERRCODE = 'QH003';
        END IF;
        BEGIN
            bytes := decode(d, 'base64');
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION '%: source.data is not valid base64', at USING ERRCODE = 'QH003';
        END;
        IF hango_sniff(bytes) IS DISTINCT FROM mt THEN
            RAISE EXCEPTION '%: the data is not %: its first bytes say %', at, mt,
                coalesce(hango_sniff(bytes), 'neither PNG, JPEG, GIF, WebP nor PDF')
                USING ERRCODE = 'QH003';
        END IF;
        IF mt = 'application/pdf' THEN
            n := hango_pdf_pages(bytes);
            IF n > {MAX_PDF_PAGES} THEN
                RAISE EXCEPTION '%: the PDF has % pages; the API takes at most {MAX_PDF_PAGES}', at, n
                    USING ERRCODE = 'QH003';
            END IF;
        END IF;
    END LOOP;
    IF images > {MAX_IMAGES} THEN
        RAISE EXCEPTION 'input.content holds % images; the API takes at most {MAX_IMAGES} per request',
            images USING ERRCODE = 'QH003';
    END IF;
END $fn$
"""

RUN_INPUT = """
CREATE FUNCTION hango_run_input(input jsonb, config jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE k text;
BEGIN
    IF jsonb_typeof(input) IS DISTINCT FROM 'object' OR NOT input ? 'content' THEN
        RETURN hango_run_input_text(input, config);
    END IF;
    IF input - 'text' - 'content' <> '{}'::jsonb THEN
        SELECT min(x) INTO k FROM jsonb_object_keys(input - 'text' - 'content') x;
        RAISE EXCEPTION 'input has an unknown key %: it holds "text" and "content" (limits and '
            'memory_key go in config)', quote_literal(k) USING ERRCODE = 'QH003';
    END IF;
    IF jsonb_path_exists(input, 'strict $.**{64}') THEN  -- 0013's rule: 64 levels at most
        RAISE EXCEPTION 'input is nested more than 64 levels deep' USING ERRCODE = 'QH003';
    END IF;
    IF input ? 'text' AND (jsonb_typeof(input->'text') <> 'string' OR input->>'text' = '') THEN
        RAISE EXCEPTION 'input.text must be a non-empty string' USING ERRCODE = 'QH003';
    END IF;
    PERFORM hango_check_content(input->'content');
    -- config is checked (and merged) by the text input's function
    RETURN input || (hango_run_input_text('{"text": "-"}'::jsonb, config) - 'text');
END $fn$
"""

STORE_BLOBS = f"""
CREATE FUNCTION hango_store_blobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE b jsonb; blocks jsonb := '[]'::jsonb; d bytea; h bytea;
BEGIN
    FOR b IN SELECT e.value FROM jsonb_array_elements(NEW.input->'content') WITH ORDINALITY e
        ORDER BY e.ordinality
    LOOP
        IF b->'source'->>'type' = 'base64' AND length(b->'source'->>'data') >= {BLOB_MIN_CHARS} THEN
            d := decode(b->'source'->>'data', 'base64');
            h := sha256(d);
            INSERT INTO blobs (tenant_id, sha256, media_type, size, data)
                VALUES (NEW.tenant_id, h, coalesce(b->'source'->>'media_type', ''),
                    octet_length(d), d)
                ON CONFLICT DO NOTHING;
            b := jsonb_set(b, '{{source}}', ((b->'source') - 'data')
                || jsonb_build_object('hango_blob', encode(h, 'hex'), 'size', octet_length(d)));
        END IF;
        blocks := blocks || jsonb_build_array(b);
    END LOOP;
    NEW.input := jsonb_set(NEW.input, '{{content}}', blocks);
    RETURN NEW;
END $fn$
"""

REF_BLOBS = """
CREATE FUNCTION hango_ref_blobs() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO run_blobs (run_id, sha256, tenant_id)
        SELECT DISTINCT NEW.id, decode(e.value->'source'->>'hango_blob', 'hex'), NEW.tenant_id
        FROM jsonb_array_elements(NEW.input->'content') e
        WHERE e.value->'source' ? 'hango_blob'
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $fn$
"""

_WHEN = "WHEN (jsonb_typeof(NEW.input->'content') = 'array')"
INTERNAL = (
    "hango_sniff(bytea)",
    "hango_pdf_pages(bytea)",
    "hango_check_content(jsonb)",
    "hango_run_input(jsonb, jsonb)",
    "hango_store_blobs()",
    "hango_ref_blobs()",
)


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("tenant_id", pg.UUID(as_uuid=False), primary_key=True),
        sa.Column("sha256", sa.LargeBinary, primary_key=True),
        sa.Column("media_type", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.execute("ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "run_blobs",
        sa.Column(
            "run_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("sha256", sa.LargeBinary, primary_key=True),
        sa.Column("tenant_id", pg.UUID(as_uuid=False), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "sha256"],
            ["blobs.tenant_id", "blobs.sha256"],
            name="run_blobs_blob_fkey",
        ),
    )
    op.create_index("run_blobs_blob_idx", "run_blobs", ["tenant_id", "sha256"])
    op.execute("ALTER FUNCTION hango_run_input(jsonb, jsonb) RENAME TO hango_run_input_text")
    for ddl in (SNIFF, PDF_PAGES, CHECK_CONTENT, RUN_INPUT, STORE_BLOBS, REF_BLOBS):
        op.execute(ddl)
    for fn in INTERNAL:
        op.execute(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC")
    op.execute(
        f"CREATE TRIGGER runs_store_blobs BEFORE INSERT ON runs FOR EACH ROW {_WHEN} "
        "EXECUTE FUNCTION hango_store_blobs()"
    )
    op.execute(
        f"CREATE TRIGGER runs_ref_blobs AFTER INSERT ON runs FOR EACH ROW {_WHEN} "
        "EXECUTE FUNCTION hango_ref_blobs()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER runs_ref_blobs ON runs")
    op.execute("DROP TRIGGER runs_store_blobs ON runs")
    for fn in INTERNAL:
        op.execute(f"DROP FUNCTION {fn}")
    op.execute("ALTER FUNCTION hango_run_input_text(jsonb, jsonb) RENAME TO hango_run_input")
    op.drop_table("run_blobs")
    op.drop_table("blobs")
