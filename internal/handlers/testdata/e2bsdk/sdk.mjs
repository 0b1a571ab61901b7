// Driven by TestE2BSDK (internal/handlers/e2b_sdk_test.go): the official E2B
// JS SDK, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY,
// against a real console. It prints one JSON line of what it saw; the Go
// test asserts on it.
import { Sandbox } from 'e2b'

const out = {}
const sbx = await Sandbox.create()
out.sandboxId = sbx.sandboxId

const hi = await sbx.commands.run('echo hi')
out.echo = { stdout: hi.stdout, exitCode: hi.exitCode }

// Each line as its callback saw it, with when (ms since the command was
// started): printed a second apart, received a second apart.
const started = performance.now()
out.lines = []
await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 1; done', {
  onStdout: (data) => out.lines.push({ data, ms: Math.round(performance.now() - started) }),
})

// How long after its print each line reached onStdout: the command prints
// the time (ms, same machine clock) and the callback subtracts it.
out.latencyMs = []
await sbx.commands.run('for i in 1 2 3; do date +%s%3N; sleep 1; done', {
  onStdout: (data) => out.latencyMs.push(Date.now() - Number(data.trim())),
})

await sbx.files.write('sdk/hello.txt', 'written by the E2B SDK\n')
out.read = await sbx.files.read('sdk/hello.txt')
// gzip: an octet-stream upload with Content-Encoding: gzip (envd 0.5.7).
await sbx.files.write('sdk/zipped.txt', 'gzipped by the E2B SDK\n', { gzip: true })
out.readGzip = await sbx.files.read('sdk/zipped.txt')
// Several files at once: one multipart form, each part named by its path.
await sbx.files.write([
  { path: 'sdk/multi/a.txt', data: 'first of two' },
  { path: 'sdk/multi/b.txt', data: 'second of two' },
])
out.readMulti = [await sbx.files.read('sdk/multi/a.txt'), await sbx.files.read('sdk/multi/b.txt')]

// stdin, then closeStdin (envd 0.5.2): cat ends at the end of its input.
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'fed by sendStdin\n')
await sbx.commands.closeStdin(cat.pid)
const catDone = await cat.wait()
out.stdin = { stdout: catDone.stdout, exitCode: catDone.exitCode }

try {
  await sbx.commands.run('rm -rf /tmp/gatehouse-sdk-denied')
  out.denied = null
} catch (err) {
  out.denied = `${err.name}: ${err.message}`
}

out.runningBeforeKill = await sbx.isRunning()
out.killed = await sbx.kill()
out.runningAfterKill = await sbx.isRunning().catch((err) => `${err.name}: ${err.message}`)
console.log(JSON.stringify(out))
