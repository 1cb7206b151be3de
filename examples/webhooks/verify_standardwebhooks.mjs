// Checks one request outboxd sent with the reference Standard Webhooks implementation
// (npm install standardwebhooks), and that a changed body is refused.
//   node verify_standardwebhooks.mjs SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE BODY
import { Webhook } from "standardwebhooks";

const [secret, id, timestamp, signature, body] = process.argv.slice(2);
const headers = { "webhook-id": id, "webhook-timestamp": timestamp, "webhook-signature": signature };
const webhook = new Webhook(secret);
try {
  webhook.verify(body, headers);
  console.log("standardwebhooks: verified");
} catch (error) {
  console.log("standardwebhooks: refused:", error.message);
  process.exit(1);
}
try {
  webhook.verify(body + " ", headers);
  console.log("tampered body: verified (wrong!)");
  process.exit(1);
} catch (error) {
  console.log("tampered body: refused:", error.message);
}
