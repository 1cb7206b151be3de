-- outbox schema, version 3: partition leases, so that several relays can share one database
-- (store/partitions.h). __SCHEMA__ is replaced by the quoted schema name.

-- The relays that heartbeat. A relay is live while expires_at > now() (the database's clock).
CREATE TABLE __SCHEMA__.relay_instances (
  owner text PRIMARY KEY,  -- "<instance>/<per-run suffix>", the lease owner of its messages
  started_at timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL
);

-- One row per partition. `owner` publishes the partition while lease_until > now(); `epoch` grows
-- by one at every acquisition, and claims name the epoch they hold (a stale one claims nothing).
CREATE TABLE __SCHEMA__.partition_leases (
  partition integer PRIMARY KEY,
  owner text,
  epoch bigint NOT NULL DEFAULT 0,
  lease_until timestamptz,
  acquired_at timestamptz
);
INSERT INTO __SCHEMA__.partition_leases (partition)
SELECT generate_series(0, partition_count - 1) FROM __SCHEMA__.settings;

-- The partition count is part of every message (its partition column) and of every lease: it can
-- change only while the outbox is empty and no relay is live; the lease rows follow it.
CREATE FUNCTION __SCHEMA__.settings_partition_count_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.partition_count IS NOT DISTINCT FROM OLD.partition_count THEN
    RETURN NEW;
  END IF;
  IF EXISTS (SELECT 1 FROM __SCHEMA__.messages) OR
     EXISTS (SELECT 1 FROM __SCHEMA__.relay_instances WHERE expires_at > now()) THEN
    RAISE EXCEPTION 'outbox: settings.partition_count can change only while the outbox holds no messages and no relay is running (it is %, asked %)',
      OLD.partition_count, NEW.partition_count USING ERRCODE = '55000';
  END IF;
  DELETE FROM __SCHEMA__.partition_leases WHERE partition >= NEW.partition_count;
  INSERT INTO __SCHEMA__.partition_leases (partition)
  SELECT generate_series(0, NEW.partition_count - 1) ON CONFLICT DO NOTHING;
  RETURN NEW;
END
$$;
CREATE TRIGGER settings_partition_count_guard BEFORE UPDATE ON __SCHEMA__.settings
FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.settings_partition_count_guard();

-- Gives messages leased by anyone but `keeper` in `partitions` back: claimable again at once, no
-- attempt spent. Taking a partition does this, which voids the old owner's message leases (its
-- completions no longer match: the fence).
CREATE FUNCTION __SCHEMA__.void_message_leases(partitions integer[], keeper text) RETURNS void
LANGUAGE sql VOLATILE AS $$
  UPDATE __SCHEMA__.messages m SET status = 'pending', lease_owner = NULL, lease_until = NULL
  WHERE m.status = 'processing' AND m.partition = ANY(partitions)
    AND m.lease_owner IS DISTINCT FROM keeper
$$;

-- One heartbeat of relay `relay` (one transaction, the database's clock): register or renew it,
-- hand back `release`, renew the rest of its leases, take free or expired partitions up to its fair
-- share. Fair share: the live relays ordered by owner get ceil(partitions / live) (the first
-- partitions % live of them) or floor. Returns what the relay holds and what it holds too much of.
CREATE FUNCTION __SCHEMA__.relay_heartbeat(
  relay text, lease_ms bigint, release integer[],
  OUT owned integer[], OUT epochs bigint[], OUT surplus integer[], OUT live_instances integer,
  OUT fair_share integer, OUT partition_count integer, OUT acquired integer,
  OUT taken_over integer, OUT released integer, OUT next_heartbeat_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  lease interval;
  rank integer;
  held integer;
  released_partitions integer[];
  taken integer[];
BEGIN
  IF relay IS NULL OR relay = '' THEN
    RAISE EXCEPTION 'outbox.relay_heartbeat: relay must not be empty' USING ERRCODE = '22023';
  END IF;
  IF lease_ms IS NULL OR lease_ms < 1 THEN
    RAISE EXCEPTION 'outbox.relay_heartbeat: lease_ms must be positive, got %', lease_ms
      USING ERRCODE = '22023';
  END IF;
  lease := lease_ms * interval '1 millisecond';
  SELECT s.partition_count INTO partition_count FROM __SCHEMA__.settings s;

  INSERT INTO __SCHEMA__.relay_instances AS r (owner, expires_at) VALUES (relay, now() + lease)
  ON CONFLICT (owner) DO UPDATE SET heartbeat_at = now(), expires_at = now() + lease;
  DELETE FROM __SCHEMA__.relay_instances r WHERE r.expires_at < now();

  released := 0;
  IF cardinality(release) > 0 THEN
    WITH handed_back AS (
      UPDATE __SCHEMA__.partition_leases p SET owner = NULL, lease_until = NULL
      WHERE p.partition = ANY(release) AND p.owner = relay RETURNING p.partition)
    SELECT array_agg(h.partition) INTO released_partitions FROM handed_back h;
    released := coalesce(cardinality(released_partitions), 0);
    -- What the relay still had leased there goes back unpublished.
    UPDATE __SCHEMA__.messages m SET status = 'pending', lease_owner = NULL, lease_until = NULL
    WHERE m.status = 'processing' AND m.lease_owner = relay
      AND m.partition = ANY(released_partitions);
  END IF;

  -- Renew only what is still ours (a lease taken over meanwhile has another owner).
  UPDATE __SCHEMA__.partition_leases p SET lease_until = now() + lease WHERE p.owner = relay;

  SELECT count(*), count(*) FILTER (WHERE r.owner < relay) INTO live_instances, rank
  FROM __SCHEMA__.relay_instances r WHERE r.expires_at > now();
  fair_share := partition_count / live_instances +
                CASE WHEN rank < partition_count % live_instances THEN 1 ELSE 0 END;
  SELECT count(*) INTO held FROM __SCHEMA__.partition_leases p WHERE p.owner = relay;

  acquired := 0;
  taken_over := 0;
  IF held < fair_share THEN
    -- Free partitions first, then expired ones. FOR UPDATE (not the UPDATE's weaker lock)
    -- conflicts with the FOR KEY SHARE a claim takes on the leases it claims under, so a claim is
    -- either wholly before this takeover or sees its result; SKIP LOCKED: relays heartbeating at
    -- once take different partitions.
    WITH candidates AS (
      SELECT p.partition, p.owner IS NOT NULL AS was_held FROM __SCHEMA__.partition_leases p
      WHERE p.owner IS NULL OR p.lease_until IS NULL OR p.lease_until < now()
      ORDER BY p.owner IS NOT NULL, p.partition
      LIMIT fair_share - held
      FOR UPDATE SKIP LOCKED),
    took AS (
      UPDATE __SCHEMA__.partition_leases p
      SET owner = relay, epoch = p.epoch + 1, lease_until = now() + lease, acquired_at = now()
      FROM candidates c WHERE p.partition = c.partition
      RETURNING p.partition, c.was_held)
    SELECT array_agg(t.partition), count(*), count(*) FILTER (WHERE t.was_held)
    INTO taken, acquired, taken_over FROM took t;
    IF acquired > 0 THEN
      PERFORM __SCHEMA__.void_message_leases(taken, relay);
    END IF;
  END IF;

  SELECT coalesce(array_agg(p.partition ORDER BY p.partition), '{}'),
         coalesce(array_agg(p.epoch ORDER BY p.partition), '{}')
  INTO owned, epochs FROM __SCHEMA__.partition_leases p WHERE p.owner = relay;
  SELECT coalesce(array_agg(x.partition ORDER BY x.partition), '{}') INTO surplus
  FROM (SELECT p.partition FROM __SCHEMA__.partition_leases p WHERE p.owner = relay
        ORDER BY p.partition DESC LIMIT greatest(cardinality(owned) - fair_share, 0)) x;

  -- Call again after a third of the lease, or just after the next lease of another relay expires
  -- (a relay that died: its partitions are then taken over at once).
  SELECT (extract(epoch FROM min(p.lease_until) - now()) * 1000)::bigint + 20
  INTO next_heartbeat_ms
  FROM __SCHEMA__.partition_leases p
  WHERE p.owner IS NOT NULL AND p.owner <> relay AND p.lease_until > now();
  next_heartbeat_ms := least(lease_ms / 3, coalesce(next_heartbeat_ms, lease_ms));
END
$$;

-- Clean shutdown of relay `relay`: its partitions become free at once (the others take them at
-- their next heartbeat), what it still had leased goes back unpublished, and it is deregistered.
CREATE FUNCTION __SCHEMA__.relay_leave(relay text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF relay IS NULL OR relay = '' THEN
    RAISE EXCEPTION 'outbox.relay_leave: relay must not be empty' USING ERRCODE = '22023';
  END IF;
  UPDATE __SCHEMA__.partition_leases SET owner = NULL, lease_until = NULL WHERE owner = relay;
  UPDATE __SCHEMA__.messages SET status = 'pending', lease_owner = NULL, lease_until = NULL
  WHERE status = 'processing' AND lease_owner = relay;
  DELETE FROM __SCHEMA__.relay_instances WHERE owner = relay;
END
$$;
