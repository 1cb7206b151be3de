// Command rabbitmq_inbox_consumer applies outbox messages from a RabbitMQ queue to a table exactly
// once, in Go: the twin of examples/rabbitmq_inbox_consumer.cpp and
// examples/python/rabbitmq_inbox_consumer.py, with the same command line and behaviour.
//
//	rabbitmq_inbox_consumer --amqp amqp://guest:guest@127.0.0.1:5672/ --queue orders
//	    --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
//	    [--table applied] [--dead-letter orders.dead-letter]
//
// One call of outbox.inbox_begin(...) in the consumer's own transaction decides (process,
// duplicate, gap, invalid) and records; the table row is written in that same transaction, and
// the delivery is acked only after the commit. A crash between the commit and the ack redelivers
// the message, and the inbox then says duplicate. A gap or a database failure requeues the
// delivery after a delay (doubling from 50 ms to 1 s while nothing is processed); an invalid one,
// or one not from an outbox, is rejected without requeue (dead-lettered). Runs until
// SIGTERM/SIGINT, then prints what it did. Builds from Debian's packages alone (golang-go,
// golang-github-jackc-pgx-v4-dev, golang-github-rabbitmq-amqp091-go-dev):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o rabbitmq_inbox_consumer .
package main

import (
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v4"
	_ "github.com/jackc/pgx/v4/stdlib" // database/sql's "pgx" driver
	amqp "github.com/rabbitmq/amqp091-go"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// delivery holds the inbox's arguments, as outbox's RabbitMQ sink writes them: the id in the
// message_id property, the rest in headers (NULL when absent).
type delivery struct {
	messageID     string
	streamKey     sql.NullString
	streamSeq     sql.NullInt64
	streamPrevSeq sql.NullInt64
	target        sql.NullString
}

func headerText(headers amqp.Table, name string) (sql.NullString, error) {
	switch value := headers[name].(type) {
	case nil:
		return sql.NullString{}, nil
	case string:
		return sql.NullString{String: value, Valid: true}, nil
	case []byte:
		return sql.NullString{String: string(value), Valid: true}, nil
	default:
		return sql.NullString{}, fmt.Errorf("header %s is not a string", name)
	}
}

func headerInteger(headers amqp.Table, name string) (sql.NullInt64, error) {
	var number int64
	switch value := headers[name].(type) {
	case nil:
		return sql.NullInt64{}, nil
	case int8:
		number = int64(value)
	case int16:
		number = int64(value)
	case int32:
		number = int64(value)
	case int64:
		number = value
	case uint8:
		number = int64(value)
	case uint16:
		number = int64(value)
	case uint32:
		number = int64(value)
	case string:
		parsed, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return sql.NullInt64{}, fmt.Errorf("header %s is not an integer", name)
		}
		number = parsed
	default:
		return sql.NullInt64{}, fmt.Errorf("header %s is not an integer", name)
	}
	return sql.NullInt64{Int64: number, Valid: true}, nil
}

func deliveryOf(message amqp.Delivery) (delivery, error) {
	if !uuidPattern.MatchString(message.MessageId) {
		return delivery{}, fmt.Errorf("message_id %q is not a UUID", message.MessageId)
	}
	result := delivery{messageID: message.MessageId}
	var err error
	if result.streamKey, err = headerText(message.Headers, "outbox-stream-key"); err != nil {
		return delivery{}, err
	}
	if result.streamSeq, err = headerInteger(message.Headers, "outbox-stream-seq"); err != nil {
		return delivery{}, err
	}
	if result.streamPrevSeq, err = headerInteger(message.Headers, "outbox-stream-prev-seq"); err != nil {
		return delivery{}, err
	}
	if result.target, err = headerText(message.Headers, "outbox-target"); err != nil {
		return delivery{}, err
	}
	return result, nil
}

func quoteName(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

type consumer struct {
	db     *sql.DB
	name   string
	begin  string
	insert string
	counts struct{ processed, duplicates, requeued, deadLettered int }
}

// handle decides and applies in one transaction: "ack", "requeue" or "dead-letter".
func (c *consumer) handle(message amqp.Delivery) string {
	d, err := deliveryOf(message)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dead-lettering message %s: %v\n", message.MessageId, err)
		c.counts.deadLettered++
		return "dead-letter"
	}
	decision, err := c.apply(d, message.Body)
	if err != nil {
		fmt.Fprintf(os.Stderr, "will retry %s: %v\n", d.messageID, err)
		return "requeue"
	}
	switch decision {
	case "process":
		c.counts.processed++
		return "ack"
	case "duplicate":
		c.counts.duplicates++
		return "ack"
	case "gap":
		c.counts.requeued++
		return "requeue"
	default:
		fmt.Fprintf(os.Stderr, "dead-lettering message %s: %s\n", d.messageID, decision)
		c.counts.deadLettered++
		return "dead-letter"
	}
}

func (c *consumer) apply(d delivery, body []byte) (string, error) {
	tx, err := c.db.Begin()
	if err != nil {
		return "", err
	}
	defer tx.Rollback() // after Commit: a no-op
	var decision string
	err = tx.QueryRow(c.begin, c.name, d.messageID, d.streamKey, d.streamSeq, d.streamPrevSeq,
		d.target).Scan(&decision)
	if err != nil {
		return "", err
	}
	if decision == "process" {
		if _, err = tx.Exec(c.insert, d.messageID, d.streamKey, d.streamSeq, string(body)); err != nil {
			return "", err
		}
	}
	return decision, tx.Commit()
}

// consume declares the queue (dead-lettering to deadLetter) and works through its deliveries
// until the connection fails or a signal arrives; true when it should stop.
func (c *consumer) consume(url, queue, deadLetter string, stop <-chan os.Signal) (bool, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	channel, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if err = channel.ExchangeDeclare(deadLetter, "fanout", true, false, false, false, nil); err != nil {
		return false, err
	}
	if _, err = channel.QueueDeclare(deadLetter, true, false, false, false, nil); err != nil {
		return false, err
	}
	if err = channel.QueueBind(deadLetter, "", deadLetter, false, nil); err != nil {
		return false, err
	}
	arguments := amqp.Table{"x-dead-letter-exchange": deadLetter}
	if _, err = channel.QueueDeclare(queue, true, false, false, false, arguments); err != nil {
		var refusal *amqp.Error
		if errors.As(err, &refusal) && refusal.Code == amqp.PreconditionFailed {
			fmt.Fprintf(os.Stderr, "rabbitmq_inbox_consumer: queue '%s' exists without "+
				"x-dead-letter-exchange = '%s': %v\n", queue, deadLetter, err)
			os.Exit(1)
		}
		return false, err
	}
	if err = channel.Qos(100, 0, false); err != nil {
		return false, err
	}
	deliveries, err := channel.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return false, err
	}
	delay := time.Duration(0)
	for {
		select {
		case <-stop:
			return true, nil
		case message, open := <-deliveries:
			if !open {
				return false, errors.New("the channel closed")
			}
			switch c.handle(message) {
			case "ack":
				delay = 0
				err = message.Ack(false)
			case "requeue":
				// Not yet: wait a little (longer each time nothing else moves), hand it back.
				delay = time.Duration(math.Min(math.Max(float64(delay*2), float64(50*time.Millisecond)),
					float64(time.Second)))
				select {
				case <-stop:
					return true, nil
				case <-time.After(delay):
				}
				err = message.Reject(true)
			default:
				err = message.Reject(false)
			}
			if err != nil {
				return false, err
			}
		}
	}
}

func main() {
	url := flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "the broker")
	queue := flag.String("queue", "", "the queue to consume (required)")
	dbURL := flag.String("db", "", "the consumer's PostgreSQL database (required)")
	schema := flag.String("schema", "outbox", "the outbox schema (outboxctl migrate)")
	name := flag.String("consumer", "example-consumer", "the consumer's name in the inbox")
	table := flag.String("table", "applied", "the table the messages are applied to")
	deadLetter := flag.String("dead-letter", "", "default: <queue>.dead-letter")
	flag.Parse()
	if *queue == "" || *dbURL == "" {
		fmt.Fprintln(os.Stderr, "rabbitmq_inbox_consumer: --queue and --db are required")
		os.Exit(2)
	}
	if *deadLetter == "" {
		*deadLetter = *queue + ".dead-letter"
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	db, err := sql.Open("pgx", *dbURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rabbitmq_inbox_consumer: %v\n", err)
		os.Exit(1)
	}
	db.SetMaxOpenConns(1)
	_, err = db.Exec("SET client_min_messages = warning; CREATE TABLE IF NOT EXISTS " +
		quoteName(*table) + " (id uuid, stream_key text, stream_seq bigint, payload text)")
	if err != nil {
		fmt.Fprintf(os.Stderr, "rabbitmq_inbox_consumer: %v\n", err)
		os.Exit(1)
	}
	c := &consumer{
		db:   db,
		name: *name,
		begin: "SELECT " + quoteName(*schema) +
			".inbox_begin($1, $2::uuid, $3, $4::bigint, $5::bigint, $6)",
		insert: "INSERT INTO " + quoteName(*table) + " VALUES ($1, $2, $3, $4)",
	}
	fmt.Fprintf(os.Stderr, "rabbitmq_inbox_consumer: consuming queue '%s' into %s as '%s' "+
		"(Go, SQL inbox)\n", *queue, *table, *name)
	for {
		stopped, err := c.consume(*url, *queue, *deadLetter, stop)
		if stopped {
			break
		}
		// The broker went away: unacked deliveries come back after we reconnect.
		fmt.Fprintf(os.Stderr, "reconnecting after: %v\n", err)
		select {
		case <-stop:
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	fmt.Printf("processed %d, duplicates %d, requeued out of order %d, dead-lettered %d\n",
		c.counts.processed, c.counts.duplicates, c.counts.requeued, c.counts.deadLettered)
}
