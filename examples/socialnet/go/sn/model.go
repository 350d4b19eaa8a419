package sn

// The objects services pass each other, as JSON (DeathStarBench's Thrift
// structs, same fields).

type Creator struct {
	UserID   int64  `json:"user_id"`
	Username string `json:"username"`
}

type Mention struct {
	UserID   int64  `json:"user_id"`
	Username string `json:"username"`
}

type URL struct {
	Shortened string `json:"shortened_url"`
	Expanded  string `json:"expanded_url"`
}

type Media struct {
	MediaID   int64  `json:"media_id"`
	MediaType string `json:"media_type"`
}

type Post struct {
	PostID       int64     `json:"post_id"`
	Creator      Creator   `json:"creator"`
	ReqID        int64     `json:"req_id"`
	Text         string    `json:"text"`
	UserMentions []Mention `json:"user_mentions"`
	Media        []Media   `json:"media"`
	URLs         []URL     `json:"urls"`
	Timestamp    int64     `json:"timestamp"` // ms since the epoch
	PostType     string    `json:"post_type"` // POST, REPOST, REPLY, DM
}

// TextResult is what sn-text makes of a post's text: URLs replaced by
// their short forms, and the users it mentions.
type TextResult struct {
	Text         string    `json:"text"`
	UserMentions []Mention `json:"user_mentions"`
	URLs         []URL     `json:"urls"`
}

// Range is a page of a timeline: entries [Start, Stop) newest first.
type Range struct {
	UserID int64 `json:"user_id"`
	Start  int64 `json:"start"`
	Stop   int64 `json:"stop"`
}

// TimelineLenMax bounds one read (DeathStarBench's frontend reads 10).
const TimelineLenMax = 100

func (r Range) check() error {
	if r.UserID <= 0 {
		return badInput("user_id must be a positive integer")
	}
	if r.Start < 0 || r.Stop < r.Start || r.Stop-r.Start > TimelineLenMax {
		return badInput("start and stop must satisfy 0 <= start <= stop <= start+%d", TimelineLenMax)
	}
	return nil
}

var postTypes = map[string]bool{"POST": true, "REPOST": true, "REPLY": true, "DM": true}
