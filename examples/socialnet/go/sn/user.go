package sn

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// userRecord is a user as cached in memcached under "u:<username>" and kept
// in PostgreSQL's users table (the document store's user collection).
type userRecord struct {
	UserID    int64  `json:"user_id"`
	Username  string `json:"username"`
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name"`
	Salt      string `json:"salt"`
	Password  string `json:"password"` // hex SHA-256 of salt + password
}

var usernameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

type userReq struct {
	Op        string `json:"op"`
	UserID    int64  `json:"user_id"`
	Username  string `json:"username"`
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name"`
	Password  string `json:"password"`
}

// User (sn-user): register, login, the creator of a post, a user's id.
func User(ctx Ctx, in []byte) ([]byte, error) {
	var req userReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	switch req.Op {
	case "register":
		return register(ctx, req)
	case "login":
		return login(ctx, req)
	case "compose_creator":
		if req.UserID <= 0 || !usernameRe.MatchString(req.Username) {
			return nil, badInput("compose_creator needs user_id and username")
		}
		return reply(Creator{UserID: req.UserID, Username: req.Username})
	case "get_user_id":
		u, err := lookupUser(ctx, req.Username)
		if err != nil {
			return nil, err
		}
		return reply(map[string]int64{"user_id": u.UserID})
	}
	return nil, badInput("sn-user: unknown op %q", req.Op)
}

func hashPassword(salt, password string) string {
	h := sha256.Sum256([]byte(salt + password))
	return hex.EncodeToString(h[:])
}

func register(ctx Ctx, req userReq) ([]byte, error) {
	if !usernameRe.MatchString(req.Username) {
		return nil, badInput("username must be 1-64 letters, digits, _ or -")
	}
	if req.Password == "" {
		return nil, badInput("password must not be empty")
	}
	if req.UserID < 0 {
		return nil, badInput("user_id must be positive")
	}
	if req.UserID == 0 {
		var id struct {
			PostID int64 `json:"post_id"`
		}
		if err := call(ctx, SvcUniqueID, map[string]string{"op": "compose_unique_id", "post_type": "USER"}, &id); err != nil {
			return nil, err
		}
		req.UserID = id.PostID
	}
	var salt [16]byte
	_, _ = rand.Read(salt[:])
	u := userRecord{UserID: req.UserID, Username: req.Username, FirstName: req.FirstName, LastName: req.LastName,
		Salt: hex.EncodeToString(salt[:])}
	u.Password = hashPassword(u.Salt, req.Password)
	doc, _ := json.Marshal(u)
	db, err := pg(ctx.GoContext())
	if err != nil {
		return nil, err
	}
	_, err = db.Exec(ctx.GoContext(), `INSERT INTO users (user_id, username, doc) VALUES ($1, $2, $3)`,
		u.UserID, u.Username, doc)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil, badInput("user %s (or user id %d) is already registered", u.Username, u.UserID)
	}
	if err != nil {
		return nil, fmt.Errorf("storing user %s: %w", u.Username, err)
	}
	return reply(map[string]int64{"user_id": u.UserID})
}

// lookupUser reads a user through memcached.
func lookupUser(ctx Ctx, username string) (*userRecord, error) {
	if !usernameRe.MatchString(username) {
		return nil, badInput("bad username %q", username)
	}
	users, err := lookupUsers(ctx, []string{username})
	if err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, badInput("no user named %s", username)
	}
	return users[0], nil
}

// lookupUsers reads users by name through memcached: one multi-get, then
// the misses from PostgreSQL in one query, written back to the cache.
// Unknown names are left out.
func lookupUsers(ctx Ctx, names []string) ([]*userRecord, error) {
	if len(names) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(names))
	for _, n := range names {
		keys = append(keys, "u:"+n)
	}
	hits, err := mc().GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("memcached: %w", err)
	}
	found := make(map[string]*userRecord, len(names))
	var misses []string
	for _, n := range names {
		if it, ok := hits["u:"+n]; ok {
			var u userRecord
			if json.Unmarshal(it.Value, &u) == nil {
				found[n] = &u
				continue
			}
		}
		misses = append(misses, n)
	}
	if len(misses) > 0 {
		db, err := pg(ctx.GoContext())
		if err != nil {
			return nil, err
		}
		rows, err := db.Query(ctx.GoContext(), `SELECT doc FROM users WHERE username = ANY($1)`, misses)
		if err != nil {
			return nil, fmt.Errorf("reading users: %w", err)
		}
		docs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return nil, fmt.Errorf("reading users: %w", err)
		}
		for _, doc := range docs {
			var u userRecord
			if err := json.Unmarshal(doc, &u); err != nil {
				return nil, fmt.Errorf("user document: %w", err)
			}
			found[u.Username] = &u
			// A failed cache write only costs the next reader a query.
			_ = mc().Set(&memcache.Item{Key: "u:" + u.Username, Value: doc})
		}
	}
	out := make([]*userRecord, 0, len(found))
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if u, ok := found[n]; ok && !seen[n] {
			seen[n] = true
			out = append(out, u)
		}
	}
	return out, nil
}

func login(ctx Ctx, req userReq) ([]byte, error) {
	u, err := lookupUser(ctx, req.Username)
	if err != nil {
		return nil, err
	}
	if !hmac.Equal([]byte(hashPassword(u.Salt, req.Password)), []byte(u.Password)) {
		return nil, badInput("wrong password for %s", req.Username)
	}
	return reply(map[string]string{"token": signToken(u)})
}

// signToken makes a bearer token: user id, name and expiry, signed with
// HMAC-SHA256 under SN_SECRET (DeathStarBench uses a JWT with the same
// claims).
func signToken(u *userRecord) string {
	claims := strconv.FormatInt(u.UserID, 10) + ":" + u.Username + ":" +
		strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	m := hmac.New(sha256.New, []byte(envOr("SN_SECRET", "socialnet-demo-secret")))
	m.Write([]byte(claims))
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(claims)) + "." + enc.EncodeToString(m.Sum(nil))
}
